"""The glasspipe operator: kopf handlers that converge each GlassPipeline onto its SparkApplications.

``plan`` (pure child diffing) and ``glasspipe.conditions`` (pure status math) hold the rules, and
``spark_operator`` what glasspipe knows of spark-operator (API coordinates, states);
``reconcile`` applies them through the Kubernetes API; ``handlers`` wires kopf events, a timer and
SparkApplication watch events to one level-triggered reconcile; ``main`` is the ``glasspipe-operator``
entry point.
"""
