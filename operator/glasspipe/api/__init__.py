"""The GlassPipeline API: models, CRD generation, durations and deep validation (pure code)."""
