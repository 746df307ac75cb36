-- offer: schedule a batch of tasks.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] dedup mode for keyed tasks: 'keep' (return the live task) or 'replace' (update a
--         pending task's payload and due time: debounce); 'back' as 'keep', for at-most-once
--         tasks a consumer fetched but never handed out: a key kept for the task's own id
--         (its fetch finished it) is the task's again
-- ARGV[2] who offers (host/pid), for the task histories of a queue that keeps them
-- ARGV[3..] groups of 4 fields per task:
--         id;
--         due: 'd' .. ms from now, or 'a' .. absolute epoch ms;
--         envelope;
--         options: '' (priority 0, no key, no ttl) or 'priority|key_ttl_ms|ttl_ms|key'
--           (key '' = none, ttl 0 = never expires); [L] either may follow '@' .. limit key
--           .. '|' (a limit key has no '|'): the task's limit_key, kept in lim:task.
-- Error LAYOUT_RETIRED: a finished reshard retired this (sub-)queue (nothing written).
-- Reply: {id_1, status_1, ...}; status 1 = created, 2 = replaced, 0 = an existing task matched
--        by id (same envelope) or key (its id is returned), 3 = a task with other content holds
--        the id, and is left as it is (for a generated id: two producers drew the same one, and
--        the queue draws again; for the caller's own id the queue raises TaskIdConflict). An id
--        given twice in one batch is judged against the content its first offer wrote.
-- Tasks without a key are written with one HSET and one ZADD for the whole batch; a single
-- plain task takes a shorter path.
-- Outbox rows (optional): KEYS[14] the shard's applied set; then ARGV ends with one apply id
-- per task and the ms to keep their receipts. A task whose apply id was recorded is skipped
-- with status 4 (applied before); the others' ids are recorded, except status 3's.
-- A layout that a finished reshard retired takes no new task: the caller's layout is stale
-- (error LAYOUT_RETIRED: it reads the layout again and writes there).
local flags = redis.call('HMGET', K_COUNTERS, 'retired', 'hist')
if flags[1] then
  return redis.error_reply('LAYOUT_RETIRED this layout of the queue was resharded away')
end
local mode, origin = ARGV[1], ARGV[2]
local now, later = now_ms()
-- [H] The settings, when counters' mirror says the queue keeps histories.
local h = false
if flags[2] then h = hist_settings(true) else hist_conf = false end
local applied = KEYS[14]
local n = applied and (#ARGV - 3) / 5 or (#ARGV - 2) / 4
local fresh = nil
if applied then
  local apply_ids = {}
  for i = 1, n do apply_ids[i] = ARGV[2 + 4 * n + i] end
  fresh = unapplied(applied, apply_ids, now)
end
local old_head = head_score(K_DELAYED)
local new_min = nil
local created = 0
local reply = {}
local task_fields, delayed_fields, expiry_fields = {}, {}, {}
local seen = {}  -- id -> envelope, for ids this call wrote: later items must see them

-- The common single offer (no key, ttl or priority) in as few commands as possible.
if n == 1 and ARGV[6] == '' and not applied then
  local id, due_arg = ARGV[3], ARGV[4]
  local due = tonumber(string.sub(due_arg, 2))
  if string.byte(due_arg, 1) == 100 then due = (due > 0 and later or now) + due end
  if redis.call('HSETNX', K_TASKS, id, ARGV[5]) == 0 then
    return {id, redis.call('HGET', K_TASKS, id) == ARGV[5] and 0 or 3}
  end
  local s = score(due, 9)
  redis.call('ZADD', K_DELAYED, fmt(s), id)
  count('offered', 1)
  if h then hist_add(h, id, now, 'offered', 0, 'by ' .. origin .. ', ' .. hist_due(due, now)) end
  announce_if_earlier(s, old_head)
  return {id, 1}
end

-- The task holding key now, if any: live (pending or in flight), or kept after completion.
local function holder_of(key)
  local id = redis.call('HGET', K_KEYMAP, key)
  if not id then return nil end
  if redis.call('HEXISTS', K_TASKS, id) == 1 and not redis.call('ZSCORE', K_DEAD, id) then
    local deadline = redis.call('ZSCORE', K_EXPIRY, id)
    if not (deadline and tonumber(deadline) < now and redis.call('ZREM', K_DELAYED, id) == 1) then
      return id
    end
    hist_ended({id}, now, 'expired', 'its ttl ran out before a delivery')
    forget(id, now, false)  -- its ttl ran out before anyone took it: expired, key free
    count('expired', 1)
  end
  local kept = redis.call('ZSCORE', K_KEPT, key)
  if kept and tonumber(kept) > now then return id end
  redis.call('HDEL', K_KEYMAP, key)
  redis.call('ZREM', K_KEPT, key)
  return nil
end

local function set_expiry(id, due, ttl)
  if ttl > 0 then redis.call('ZADD', K_EXPIRY, fmt(due + ttl), id)
  else redis.call('ZREM', K_EXPIRY, id) end
end

local ids = {}
for i = 0, n - 1 do ids[i + 1] = ARGV[3 + i * 4] end
local stored = redis.call('HMGET', K_TASKS, unpack(ids))

for i = 0, n - 1 do
  local base = 3 + i * 4
  local id, due_arg, envelope, options = ARGV[base], ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
  local due = tonumber(string.sub(due_arg, 2))
  if string.byte(due_arg, 1) == 100 then due = (due > 0 and later or now) + due end  -- 'd': relative
  local slot, key_ttl, ttl, key = 9, 0, 0, ''
  local limit_key = nil
  if string.byte(options, 1) == 64 then  -- [L] '@': the task's limit key comes first
    local bar = string.find(options, '|', 2, true)
    limit_key = string.sub(options, 2, bar - 1)
    options = string.sub(options, bar + 1)
  end
  if options ~= '' then
    local p, kt, t, k = string.match(options, '^(%d)|(%d+)|(%d+)|(.*)$')
    slot, key_ttl, ttl, key = 9 - tonumber(p), tonumber(kt), tonumber(t), k
  end
  local s = score(due, slot)

  local held = seen[id] or stored[i + 1]  -- the content a task with this id has, if any
  local holder = nil
  if held then
    holder = id
  elseif key ~= '' and not (fresh and not fresh[i + 1]) then
    holder = holder_of(key)
    if holder == id and mode == 'back' then holder = nil end
  end

  if fresh and not fresh[i + 1] then
    reply[#reply + 1] = id
    reply[#reply + 1] = 4
  elseif held and held ~= envelope then
    reply[#reply + 1] = id
    reply[#reply + 1] = 3
  elseif holder and holder ~= id and mode == 'replace' and redis.call('ZSCORE', K_DELAYED, holder) then
    redis.call('HSET', K_TASKS, holder, envelope)
    redis.call('ZADD', K_DELAYED, fmt(s), holder)
    redis.call('HSET', K_TASKKEY, holder, key_ttl .. '|' .. key)
    set_expiry(holder, due, ttl)
    if not new_min or s < new_min then new_min = s end
    seen[holder] = envelope
    if limit_key then redis.call('HSET', flow_key('lim:task'), holder, limit_key) end  -- [L]
    if h then hist_note(holder, now, 'replaced', 'by ' .. origin .. ', ' .. hist_due(due, now)) end
    reply[#reply + 1] = holder
    reply[#reply + 1] = 2
  elseif holder then  -- the key's task, or this one again: the same content, or its key
    -- kept after it finished (a producer's late retry must not run it twice)
    reply[#reply + 1] = holder
    reply[#reply + 1] = 0
  else
    seen[id] = envelope
    if limit_key then  -- [L]
      redis.call('HSET', flow_key('lim:task'), id, limit_key)
      flow_seen.task = true
    end
    if key ~= '' then
      -- written at once: a later task of this batch with the same key must see it
      redis.call('HSET', K_TASKS, id, envelope)
      redis.call('ZADD', K_DELAYED, fmt(s), id)
      redis.call('HSET', K_KEYMAP, key, id)
      redis.call('HSET', K_TASKKEY, id, key_ttl .. '|' .. key)
      redis.call('ZREM', K_KEPT, key)
    else
      task_fields[#task_fields + 1] = id
      task_fields[#task_fields + 1] = envelope
      delayed_fields[#delayed_fields + 1] = fmt(s)
      delayed_fields[#delayed_fields + 1] = id
    end
    if ttl > 0 and key ~= '' then
      set_expiry(id, due, ttl)  -- at once: a later item of this batch may replace the task
    elseif ttl > 0 then
      expiry_fields[#expiry_fields + 1] = fmt(due + ttl)
      expiry_fields[#expiry_fields + 1] = id
    end
    if not new_min or s < new_min then new_min = s end
    created = created + 1
    if h then hist_add(h, id, now, 'offered', 0, 'by ' .. origin .. ', ' .. hist_due(due, now)) end
    reply[#reply + 1] = id
    reply[#reply + 1] = 1
  end
end

if #task_fields > 0 then
  redis.call('HSET', K_TASKS, unpack(task_fields))
  redis.call('ZADD', K_DELAYED, unpack(delayed_fields))
end
if #expiry_fields > 0 then redis.call('ZADD', K_EXPIRY, unpack(expiry_fields)) end
count('offered', created)
if fresh then
  local recorded = {}
  for i = 1, n do
    if fresh[i] and reply[2 * i] ~= 3 then recorded[#recorded + 1] = ARGV[2 + 4 * n + i] end
  end
  record_applied(applied, recorded, now, tonumber(ARGV[#ARGV]))
end
announce_if_earlier(new_min, old_head)
return reply
