-- Argo CD health of a glasspipe.io GlassPipeline, from the conditions glasspipe-operator writes
-- (operator/glasspipe/conditions.py): Ready, Progressing, Degraded, and status.observedGeneration.
-- Lua 5.1 (gopher-lua). Healthy only when the operator has seen the current spec and Ready=True.
local hs = {}

if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "spec.suspend is true: no Spark application runs; checkpoints and offsets are kept"
  return hs
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for glasspipe-operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for glasspipe-operator to observe generation " .. tostring(generation)
  if observed ~= nil then
    hs.message = hs.message .. " (observed " .. tostring(observed) .. ")"
  end
  return hs
end

local conditions = {}
for _, c in ipairs(obj.status.conditions) do
  if c.type ~= nil then
    conditions[c.type] = c
  end
end

local function text(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local degraded = conditions["Degraded"]
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = text(degraded, "Degraded")
  return hs
end

local ready = conditions["Ready"]
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = text(ready, "Ready")
  return hs
end

local progressing = conditions["Progressing"]
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = text(progressing, "Progressing")
  return hs
end

-- Ready False or Unknown without a failure: still converging (for example before the first
-- reconciliation, or while spark-operator has not yet looked at a new application).
hs.status = "Progressing"
hs.message = text(ready, "Waiting for Ready")
return hs
