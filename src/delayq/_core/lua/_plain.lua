-- The plain fetch and ack (scripts.py): the same bodies for a queue with no pause, limits,
-- limit keys, task histories or schedules. These blocks stand in for the library's functions
-- of the same names, so the optional subsystems' ~30 functions are not made on every call
-- (each costs Redis time before the first command runs). plain_refused() runs first: when
-- any of those features' keys exists the script returns nil without writing anything, and
-- the client sends the full script instead.

local function plain_refused()
  -- The same EXISTS tells the fetch whether tasks with a ttl exist: K_EXPIRY is named once,
  -- each feature key twice, so an odd count is K_EXPIRY's. The features' keys come from the
  -- client after the receipt (keys.py FEATURE_ROLES: FLOW_KEYS's, the histories' settings
  -- and the schedules' wake plan and fires): building them here cost every call.
  local found = redis.call('EXISTS', K_EXPIRY, KEYS[15], KEYS[15], KEYS[16], KEYS[16],
    KEYS[17], KEYS[17], KEYS[18], KEYS[18], KEYS[19], KEYS[19], KEYS[20], KEYS[20],
    KEYS[21], KEYS[21], KEYS[22], KEYS[22], KEYS[23], KEYS[23], KEYS[24], KEYS[24])
  plain_seen.expiry = found % 2 == 1
  return found >= 2
end

local function expiry_exists() return plain_seen.expiry end

local function flow_probe() end
local function hist_settings() return false end
local function queue_pause_state() return false, nil end
local function sched_probe() return false end
local function lease_ended() end
local function task_ended() end
local function hist_note() end
local function hist_ended() end
local function limit_keys_forget() end
local function unpark() return false end

-- Reached only behind a feature the refusal rules out.
local function limited_due() error('delayq: the plain fetch met flow control') end
local function limits_charge() error('delayq: the plain fetch met flow control') end
local function hist_add() error('delayq: the plain script met a task history') end
local function hist_span() error('delayq: the plain script met a task history') end
local function sched_advance() error('delayq: the plain fetch met a schedule') end
