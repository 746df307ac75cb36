-- offer: schedule a batch of tasks.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] dedup mode for keyed tasks: 'keep' (return the live task) or 'replace' (update a
--         pending task's payload and due time: debounce)
-- ARGV[2] n, then n groups of 8 fields:
--         id, due kind ('d' = relative ms, 'a' = absolute epoch ms), value, priority (0-9),
--         envelope, dedup key ('' = none), key_ttl_ms, ttl_ms (0 = never expires)
-- Reply: {id_1, status_1, ...}; status 1 = created, 2 = replaced, 0 = an existing task matched
--        by id or key (its id is returned).
local mode = ARGV[1]
local n = tonumber(ARGV[2])
local now = now_ms()
local old_head = head_score(K_DELAYED)
local new_min = nil
local created = 0
local reply = {}

-- The task holding key now, if any: live (pending or in flight), or kept after completion.
local function holder_of(key)
  local id = redis.call('HGET', K_KEYMAP, key)
  if not id then return nil end
  if redis.call('HEXISTS', K_TASKS, id) == 1 and not redis.call('ZSCORE', K_DEAD, id) then
    return id
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

for i = 0, n - 1 do
  local base = 3 + i * 8
  local id, kind, value = ARGV[base], ARGV[base + 1], tonumber(ARGV[base + 2])
  local slot = 9 - tonumber(ARGV[base + 3])
  local envelope, key = ARGV[base + 4], ARGV[base + 5]
  local key_ttl, ttl = tonumber(ARGV[base + 6]), tonumber(ARGV[base + 7])
  local due = value
  if kind == 'd' then due = now + value end
  local s = score(due, slot)

  local holder = nil
  if redis.call('HEXISTS', K_TASKS, id) == 1 then
    holder = id
  elseif key ~= '' then
    holder = holder_of(key)
  end

  if holder and holder ~= id and mode == 'replace' and redis.call('ZSCORE', K_DELAYED, holder) then
    redis.call('HSET', K_TASKS, holder, envelope)
    redis.call('ZADD', K_DELAYED, fmt(s), holder)
    redis.call('HSET', K_TASKKEY, holder, key_ttl .. '|' .. key)
    set_expiry(holder, due, ttl)
    if not new_min or s < new_min then new_min = s end
    reply[#reply + 1] = holder
    reply[#reply + 1] = 2
  elseif holder then
    reply[#reply + 1] = holder
    reply[#reply + 1] = 0
  else
    redis.call('HSET', K_TASKS, id, envelope)
    redis.call('ZADD', K_DELAYED, fmt(s), id)
    if key ~= '' then
      redis.call('HSET', K_KEYMAP, key, id)
      redis.call('HSET', K_TASKKEY, id, key_ttl .. '|' .. key)
      redis.call('ZREM', K_KEPT, key)
    end
    if ttl > 0 then set_expiry(id, due, ttl) end
    if not new_min or s < new_min then new_min = s end
    created = created + 1
    reply[#reply + 1] = id
    reply[#reply + 1] = 1
  end
end

count('offered', created)
announce_if_earlier(new_min, old_head)
return reply
