-- Shared preamble, prepended to every script by scripts.py.
--
-- KEYS is the same for every script: the queue's key set in keys.py order, all under one
-- {hash tag} so each script touches a single cluster slot.
--
-- Scores of the delayed, inflight and dead sorted sets pack two numbers:
--   score = milliseconds * 10 + slot,  slot = 9 - priority
-- so tasks due in the same millisecond come out highest priority first, and a task's priority
-- travels with it from set to set without another lookup. string.format('%.0f') writes scores:
-- Lua's tostring keeps only 14 significant digits and a score has 15.
local K_DELAYED, K_TASKS, K_INFLIGHT, K_LEASES, K_ATTEMPTS, K_DEAD, K_ERRORS,
      K_EXPIRY, K_KEYMAP, K_TASKKEY, K_KEPT, K_COUNTERS, K_EVENTS = unpack(KEYS)

local SLOTS = 10
-- [S] Per script call: whether the queue has no schedule fires alive (task_ended's one look).
local sched_memo = {}
local SCHED_GRACE_MS = 1000  -- catchup="skip" without a window: a fire this late still runs
local SCHED_MAX_REPLAY = 100  -- catchup="all": most fires replayed by one step
local SCHED_MAX_BUFFER = 100  -- overlap="buffer_all": most fires held back
local SCHED_LOW = 8  -- fewer cron times ahead than this: ask the client for more
-- A fire is made this long before its time (at most half its period): at its time it is an
-- ordinary delayed task, handed out by the wake plan to the millisecond, and a burst of fires
-- costs its steps before it, not at it.
local SCHED_LEAD_MS = 1000
local flow_seen = {}  -- [L] per call: which flow-control keys exist (see lease_ended)

-- One clock for everybody: the server's. Returns now in whole ms and, second, the next whole
-- ms: a positive delay counts from there, so a task is never due before now + delay.
local function now_ms()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return now, now + ((tonumber(t[2]) % 1000 > 0) and 1 or 0)
end

local function fmt(n) return string.format('%.0f', n) end
local function score(ms, slot) return ms * SLOTS + slot end
local function ms_of(s) return math.floor(tonumber(s) / SLOTS) end
local function slot_of(s) return tonumber(s) % SLOTS end

local function head_score(key)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return nil
end

-- Wake sleeping consumers only when the earliest due time moved earlier; the message is a
-- hint (consumers also re-check on their own), so losing it delays but never stalls.
-- On a cluster the channel is a shard channel (its name ends in ':sevents', see keys.py):
-- SPUBLISH reaches only the slot's node, where PUBLISH goes to every node. Redis 6.2 has no
-- sharded pub/sub (nor REDIS_VERSION_NUM), and its subscribers fall back to SUBSCRIBE.
local function announce_if_earlier(new_min, old_head)
  if new_min and (not old_head or new_min < old_head) then
    local sharded = redis.REDIS_VERSION_NUM and string.sub(K_EVENTS, -8) == ':sevents'
    redis.call(sharded and 'SPUBLISH' or 'PUBLISH', K_EVENTS, fmt(ms_of(new_min)))
  end
end

local function backoff_ms(attempts, base, cap, factor)
  local d = base * 2 ^ math.max(attempts - 1, 0)
  if d > cap then d = cap end
  return math.floor(d * factor)
end

-- A call's receipt (KEYS[14]) holds its reply for a while: a resend of the same call (same
-- nonce, so the same receipt key) answers from it instead of acting twice.
local function stored_reply(receipt)
  local stored = redis.call('GET', receipt)
  if not stored then return nil end
  local reply = {}
  for i = 1, #stored do reply[i] = string.byte(stored, i) - 48 end
  return reply
end

-- The reply of ack or cancel (statuses 0-9) as one string of digits: cheaper than a list.
local function keep_reply(receipt, reply, ms)
  if #reply > 0 then
    redis.call('SET', receipt, table.concat(reply), 'PX', ms)
  end
end

local function count(field, n)
  if n ~= 0 then redis.call('HINCRBY', K_COUNTERS, field, n) end
end

-- [L] Flow control (issue #20): pause and limits. Their keys are derived from the queue's
-- own prefix (`prefix:{name}:` + role), so they share its hash tag and cluster slot.
local function flow_key(role) return string.sub(K_COUNTERS, 1, -9) .. role end

-- Which flow-control state the queue has (pause, limits, holds, gates, held slots, tasks'
-- limit keys), looked up once per call: one EXISTS for a queue that uses none of it.
local function flow_probe()
  if flow_seen.held ~= nil then return end
  local pause, lim, hold = flow_key('pause'), flow_key('lim'), flow_key('lim:hold')
  local gate, held, task = flow_key('lim:gate'), flow_key('lim:held'), flow_key('lim:task')
  if redis.call('EXISTS', pause, lim, hold, gate, held, task) == 0 then
    flow_seen.pause, flow_seen.lim, flow_seen.held, flow_seen.task = false, false, false, false
  else
    flow_seen.pause = redis.call('EXISTS', pause) == 1
    -- limits, a RateLimited hold or a parked key's gate: fetch takes the limited path
    flow_seen.lim = redis.call('EXISTS', lim, hold, gate) > 0
    flow_seen.held = redis.call('EXISTS', held) == 1
    flow_seen.task = redis.call('EXISTS', task) == 1
  end
end

-- Whether the queue is paused at now, and until when (0: until resumed). An unpaused queue
-- pays flow_probe's one EXISTS (shared with the limits). A timed pause that ran out ends
-- here, on the server's clock, whoever looks first.
local function queue_pause_state(now)
  flow_probe()
  if not flow_seen.pause then return false, nil end
  local key = flow_key('pause')
  local until_ms = redis.call('HGET', key, 'until')
  if not until_ms then return false, nil end
  until_ms = tonumber(until_ms)
  if until_ms > 0 and until_ms <= now then
    redis.call('DEL', key)
    return false, nil
  end
  return true, until_ms
end

-- Limits (see _core/limits.py for the encoding). Under the queue's prefix:
--   lim        HASH limit key -> 'rate|per_us|burst|concurrency|weight' ('' = none); '*' is
--              the whole queue, '~default' every key without its own. No hash: no limits.
--   lim:task   HASH task id -> its limit key (offer's limit_key)
--   lim:tat    HASH limit key -> GCRA theoretical arrival time, epoch us
--   lim:run    HASH limit key -> leases held ('*': all leases handed out under limits)
--   lim:held   HASH task id -> the limit key its lease holds a slot of ('' = only '*')
--   lim:w:<k>  ZSET parked task id -> its score in the delayed set (order kept)
--   lim:gate   ZSET limit key -> ms its parked head may run again (a rate limit's exact
--              retry-after; '*': when the queue may hand out again)
--   lim:full   SET limit keys at their concurrency cap with tasks waiting ('*' too)
--   lim:hold   HASH limit key -> ms until which a handler's RateLimited holds it ('*': a
--              task without a limit key raised it: the whole queue waits)
-- A key with parked tasks always has a way back: a gate time, or a place in lim:full that
-- the next lease to end takes up (one freed slot re-admits one waiter).
local function limit_of(spec)
  if not spec then return nil end
  local rate, per, burst, conc = string.match(spec, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|')
  local lim = {conc = tonumber(conc)}
  if rate ~= '' then
    lim.rate = tonumber(rate)
    lim.t = tonumber(per) / lim.rate  -- emission interval, us
    lim.tau = lim.t * (tonumber(burst) - 1)  -- how far ahead of now the TAT may run
    lim.burst = tonumber(burst)
  end
  return lim
end

local function parked_key(key) return flow_key('lim:w:' .. key) end

-- Put a parked key's first n waiters back in the delayed set, under their own scores (so
-- they come first, in their order): ids and scores.
local function readmit(key, n)
  local head = redis.call('ZPOPMIN', parked_key(key), n)
  if #head == 0 then return head end
  local fields = {}
  for i = 1, #head, 2 do
    fields[#fields + 1] = head[i + 1]
    fields[#fields + 1] = head[i]
  end
  redis.call('ZADD', K_DELAYED, unpack(fields))
  return head
end

local function wake_now(now)
  local sharded = redis.REDIS_VERSION_NUM and string.sub(K_EVENTS, -8) == ':sevents'
  redis.call(sharded and 'SPUBLISH' or 'PUBLISH', K_EVENTS, fmt(now))
end

-- [L] hook: the leases of ids ended (ack, nack/retry/release/reject, lease expiry, purge).
-- Frees their concurrency slots; a key (or '*') at its cap with tasks waiting re-admits one
-- waiter per freed slot, and the call sends one wake. One EXISTS for a queue without limits.
local function lease_ended(ids, now)
  flow_probe()
  if not flow_seen.held or #ids == 0 then return end
  local held_key, run, full = flow_key('lim:held'), flow_key('lim:run'), flow_key('lim:full')
  local keys = redis.call('HMGET', held_key, unpack(ids))
  local gone, wake = {}, false
  for k, id in ipairs(ids) do
    local key = keys[k]
    if key then
      gone[#gone + 1] = id
      local charged = {'*'}
      if key ~= '' then charged[2] = key end
      for _, c in ipairs(charged) do
        if redis.call('HINCRBY', run, c, -1) <= 0 then redis.call('HDEL', run, c) end
        if redis.call('SISMEMBER', full, c) == 1 then
          wake = true
          if c == '*' or #readmit(c, 1) == 0 or redis.call('EXISTS', parked_key(c)) == 0 then
            redis.call('SREM', full, c)
          end
        end
      end
    end
  end
  if #gone > 0 then redis.call('HDEL', held_key, unpack(gone)) end
  if wake then wake_now(now) end
end

-- [L] The fetch step of a queue with limits: the due tasks (id, score pairs, in order) that
-- may be handed out now, at most want. Over-limit ones are parked per key (behind that key's
-- earlier waiters: order kept) with the key gated until its exact retry-after, or listed in
-- lim:full; nothing is counted as an attempt. At most want + scan tasks are looked at.
-- Returns the pairs, the limit of each id handed (for limits_charge), and when the whole
-- queue ('*') may hand out next if it may not now (ms; -1: when a lease ends).
local function limited_due(want, scan, now_us, leased)
  flow_probe()
  local now = math.floor(now_us / 1000)
  local LIM, TAT, RUN = flow_key('lim'), flow_key('lim:tat'), flow_key('lim:run')
  local GATE, FULL = flow_key('lim:gate'), flow_key('lim:full')
  local specs, tats, runs, heads, changed, holds = {}, {}, {}, {}, {}, {}
  local HOLD = flow_key('lim:hold')
  local default = false
  local function limit_for(key)
    if specs[key] == nil then
      local spec = redis.call('HGET', LIM, key)
      if not spec and key ~= '*' and key ~= '' then
        if default == false then default = redis.call('HGET', LIM, '~default') or nil end
        spec = default
      end
      specs[key] = limit_of(spec) or false
    end
    return specs[key]
  end
  local function tat_of(key)
    if not tats[key] then tats[key] = tonumber(redis.call('HGET', TAT, key) or '0') end
    return tats[key] < now_us and now_us or tats[key]
  end
  local function running(key)
    if not runs[key] then runs[key] = tonumber(redis.call('HGET', RUN, key) or '0') end
    return runs[key]
  end
  local function held_until(key)
    if holds[key] == nil then
      local h = tonumber(redis.call('HGET', HOLD, key) or '0')
      if h > 0 and h <= now then
        redis.call('HDEL', HOLD, key)
        h = 0
      end
      holds[key] = h
    end
    return holds[key]
  end
  -- nil if key's limit lets one more start now, else 'full' or the retry-after (ms)
  local function refusal(key, lim)
    local hold = held_until(key)
    if hold > now then return hold end
    if not lim then return nil end
    if leased and lim.conc and running(key) >= lim.conc then return 'full' end
    if lim.rate then
      local allow = tat_of(key) - lim.tau
      if allow > now_us then return math.ceil(allow / 1000) end
    end
    return nil
  end
  local function take(key, lim)
    if not lim then return end
    if lim.rate then
      tats[key] = tat_of(key) + lim.t
      changed[key] = true
    end
    runs[key] = running(key) + 1
  end

  -- Keys whose gate time came: their first waiters go back to the delayed set, as many as
  -- the rate lets start now (at least one; the rest are gated anew).
  local opened = redis.call('ZRANGEBYSCORE', GATE, '-inf', now, 'LIMIT', 0, scan)
  for _, key in ipairs(opened) do
    local lim = limit_for(key)
    local n = scan  -- no limit to keep: a RateLimited hold ran out, or the limit is gone
    if lim and lim.rate then
      n = math.max(1, math.floor((now_us - (tat_of(key) - lim.tau)) / lim.t) + 1)
      if n > lim.burst then n = lim.burst end
    elseif lim and lim.conc then
      n = lim.conc
    end
    if key ~= '*' then readmit(key, n) end
    if key == '*' or redis.call('EXISTS', parked_key(key)) == 0 then
      redis.call('ZREM', GATE, key)
    elseif lim and lim.rate then  -- when the first one not let go now may start
      redis.call('ZADD', GATE, math.ceil((tat_of(key) + n * lim.t - lim.tau) / 1000), key)
    elseif lim and lim.conc then  -- the rest wait for slots: each lease that ends lets one go
      redis.call('ZREM', GATE, key)
      redis.call('SADD', FULL, key)
    else
      redis.call('ZADD', GATE, now, key)  -- no limit: the next look lets the next ones go
    end
  end

  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', fmt(score(now, 9)),
    'WITHSCORES', 'LIMIT', 0, want + scan)
  if #due == 0 then return due, {}, nil end
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  local keys = flow_seen.task and redis.call('HMGET', flow_key('lim:task'), unpack(ids)) or {}
  local picked, charged, moved = {}, {}, {}
  local parked_for = {rate = 0, concurrency = 0, queued = 0}  -- counted by reason
  local star = limit_for('*')
  local star_wait = nil
  for k, id in ipairs(ids) do
    if #picked >= 2 * want then break end
    local s, key = due[2 * k], keys[k] or ''
    local why = refusal('*', star)
    if why and why ~= 'full' and star and star.rate and held_until('*') <= now then
      -- Wake when a batch may start (the burst the limit allows anyway, no more than are
      -- due): the consumers woken then fetch batches, not one task per round trip each.
      local batch = math.min(star.burst, #ids - k + 1)
      if batch > 1 then why = math.ceil((tat_of('*') - star.tau + (batch - 1) * star.t) / 1000) end
    end
    if why then
      star_wait = why == 'full' and -1 or why
      if why == 'full' then redis.call('SADD', FULL, '*')
      else redis.call('ZADD', GATE, why, '*') end
      break
    end
    local lim = key ~= '' and limit_for(key) or false
    if key ~= '' and heads[key] == nil then
      heads[key] = head_score(parked_key(key)) or false
    end
    local behind = key ~= '' and heads[key] and heads[key] < tonumber(s)
    why = behind and 'behind' or refusal(key, lim)
    if why then
      redis.call('ZADD', parked_key(key), s, id)
      moved[#moved + 1] = id
      if not heads[key] or tonumber(s) < heads[key] then heads[key] = tonumber(s) end
      if why == 'full' then redis.call('SADD', FULL, key)
      elseif why ~= 'behind' then redis.call('ZADD', GATE, why, key) end
      local reason = why == 'full' and 'concurrency' or (why == 'behind' and 'queued' or 'rate')
      parked_for[reason] = parked_for[reason] + 1
    else
      take('*', star)
      take(key, lim)
      picked[#picked + 1] = id
      picked[#picked + 1] = s
      charged[id] = key
    end
  end
  if #moved > 0 then redis.call('ZREM', K_DELAYED, unpack(moved)) end
  for reason, n in pairs(parked_for) do count('throttled:' .. reason, n) end
  for key in pairs(changed) do redis.call('HSET', TAT, key, fmt(math.ceil(tats[key]))) end
  return picked, charged, star_wait
end

-- [L] After fetch handed tasks out under limits: each lease holds a slot of '*' and of its
-- key (the counts lease_ended gives back). At-most-once deliveries hold none.
local function limits_charge(reply, charged, leased)
  if not leased then return end
  local fields, per_key = {}, {}
  for r = 4, #reply, 6 do
    local id = reply[r]
    local key = charged[id] or ''
    fields[#fields + 1] = id
    fields[#fields + 1] = key
    per_key['*'] = (per_key['*'] or 0) + 1
    if key ~= '' then per_key[key] = (per_key[key] or 0) + 1 end
  end
  if #fields == 0 then return end
  redis.call('HSET', flow_key('lim:held'), unpack(fields))
  for key, n in pairs(per_key) do redis.call('HINCRBY', flow_key('lim:run'), key, n) end
end

-- [L] A handler raised RateLimited(delay): hold the task's limit key (none: the whole queue)
-- until now + delay and park the task in line for it under its own due time (due_ms), so it
-- keeps its place. Nothing counts an attempt.
local function throttle(id, slot, due_ms, now, delay)
  local key = redis.call('HGET', flow_key('lim:task'), id) or '*'
  local HOLD = flow_key('lim:hold')
  local until_ms = math.max(now + delay, tonumber(redis.call('HGET', HOLD, key) or '0'))
  redis.call('HSET', HOLD, key, until_ms)
  redis.call('ZADD', flow_key('lim:gate'), until_ms, key)
  local s = score(due_ms, slot)
  if key == '*' then
    redis.call('ZADD', K_DELAYED, fmt(s), id)  -- no key to park under: the queue waits
  else
    redis.call('ZADD', parked_key(key), fmt(s), id)
  end
  count('throttled:ratelimited', 1)
  wake_now(until_ms)  -- consumers asleep learn when the key (or queue) may start again
  return until_ms
end

-- [L] The limit keys of tasks leaving for good: drop their lim:task entries.
local function limit_keys_forget(ids)
  flow_probe()
  if flow_seen.task and #ids > 0 then redis.call('HDEL', flow_key('lim:task'), unpack(ids)) end
end

-- [L] A parked task's limit key and score, or nil: cancel, info and ttl expiry find it.
local function parked(id)
  flow_probe()
  if not flow_seen.task then return nil end
  local key = redis.call('HGET', flow_key('lim:task'), id)
  if not key then return nil end
  local s = redis.call('ZSCORE', parked_key(key), id)
  if not s then return nil end
  return key, s
end

-- [L] Take a parked task out of its key's waiting set; true if it was parked.
local function unpark(id)
  local key = parked(id)
  if not key then return false end
  redis.call('ZREM', parked_key(key), id)
  return true
end

-- Drop the dedup-key mapping of a task; with remember, keep the key blocked for key_ttl ms.
local function release_key(id, now, remember)
  local v = redis.call('HGET', K_TASKKEY, id)
  if not v then return end
  redis.call('HDEL', K_TASKKEY, id)
  local sep = string.find(v, '|', 1, true)
  local key_ttl = tonumber(string.sub(v, 1, sep - 1))
  local key = string.sub(v, sep + 1)
  if redis.call('HGET', K_KEYMAP, key) ~= id then return end
  if remember and key_ttl > 0 then
    redis.call('ZADD', K_KEPT, fmt(now + key_ttl), key)
  else
    redis.call('HDEL', K_KEYMAP, key)
  end
end

-- Remove every trace of a task except its place in delayed/inflight/dead (the caller's job).
local function forget(id, now, remember_key)
  redis.call('HDEL', K_TASKS, id)
  redis.call('HDEL', K_LEASES, id)
  redis.call('HDEL', K_ATTEMPTS, id)
  redis.call('HDEL', K_ERRORS, id)
  redis.call('ZREM', K_EXPIRY, id)
  release_key(id, now, remember_key)
  limit_keys_forget({id})
end

-- [S] Recurring schedules (issue #19, docs/schedules.md and docs/storage.md). Their keys hang
-- off the queue's own prefix, so they share its hash tag (one slot per script):
--   sched            HASH name -> version: the live schedules
--   sched:st:<name>  HASH a schedule's spec and state (a tombstone with a TTL once removed)
--   sched:due        ZSET name -> the nominal ms of its next fire: the chain's wake plan
--   sched:at:<name>  ZSET the cron times ahead (computed in Python: Lua has no time zones)
--   sched:fire       HASH fire task id -> schedule name, for fires offered and not yet ended
--   sched:buf:<name> LIST fires held back by the overlap policy, "id|nominal ms"
--   sched:req:<name>:<request>  a trigger or backfill request already carried out

local function sched_key(suffix) return string.sub(K_COUNTERS, 1, -9) .. suffix end

-- How long before its time a schedule's fire is made (cron times are at least 1 s apart).
local function sched_lead(st)
  if st.kind == 'every' then return math.min(SCHED_LEAD_MS, math.floor(tonumber(st.every) / 2)) end
  return math.floor(SCHED_LEAD_MS / 2)
end

local function sched_state(name)
  local flat = redis.call('HGETALL', sched_key('sched:st:' .. name))
  local st = {}
  for i = 1, #flat, 2 do st[flat[i]] = flat[i + 1] end
  return st
end

-- Offer one fire of schedule ``name`` as an ordinary task: ``id`` due at due_ms, its envelope
-- the schedule's template with the nominal time fire_ms written in. Returns false if a task
-- already holds the id (a fire is never offered twice).
local function sched_offer(name, st, id, fire_ms, due_ms)
  local tpl, ph = st.tpl, st.ph
  local at = string.find(tpl, ph, 1, true)
  local envelope = tpl
  if at then
    envelope = string.sub(tpl, 1, at - 1) .. string.format('%013.0f', fire_ms)
      .. string.sub(tpl, at + #ph)
  end
  if redis.call('HSETNX', K_TASKS, id, envelope) == 0 then return false end
  local s = score(due_ms, 9 - tonumber(st.prio))
  local old_head = head_score(K_DELAYED)
  redis.call('ZADD', K_DELAYED, fmt(s), id)
  local win = tonumber(st.win)
  if win > 0 then redis.call('ZADD', K_EXPIRY, fmt(due_ms + win), id) end
  redis.call('HSET', sched_key('sched:fire'), id, name)
  st.live = redis.call('HINCRBY', sched_key('sched:st:' .. name), 'live', 1)
  sched_memo.none = false
  count('offered', 1)
  announce_if_earlier(s, old_head)
  return true
end

-- The overlap policy for a new fire while others of the schedule are alive: 'fire', 'held'
-- (buffered until they end) or 'skipped'.
local function sched_admit(name, st, id, fire_ms)
  if st.ovl == 'allow_all' or tonumber(st.live or '0') <= 0 then return 'fire' end
  if st.ovl == 'skip' then return 'skipped' end
  local buf = sched_key('sched:buf:' .. name)
  local held = redis.call('LLEN', buf)
  if st.ovl == 'buffer_one' and held > 0 then
    redis.call('DEL', buf)
    redis.call('HINCRBY', sched_key('sched:st:' .. name), 'skipped', held)
  elseif held >= SCHED_MAX_BUFFER then
    return 'skipped'
  end
  redis.call('RPUSH', buf, id .. '|' .. fmt(fire_ms))
  return 'held'
end

-- The first interval time after ms: phase + k * every (not before start).
local function sched_every_after(st, ms)
  local every, phase = tonumber(st.every), tonumber(st.phase)
  local t = phase + (math.floor((ms - phase) / every) + 1) * every
  local start = tonumber(st.start)
  if start > 0 and t < start then t = phase + math.ceil((start - phase) / every) * every end
  return t
end

-- Jitter: the same for every process (a hash of name and time), below the gap to the next.
local function sched_jitter(name, st, fire_ms, gap)
  local jit = tonumber(st.jit)
  if gap and gap < jit then jit = gap end
  if jit <= 0 then return 0 end
  return tonumber(string.sub(redis.sha1hex(name .. '|' .. fmt(fire_ms)), 1, 12), 16) % jit
end

-- A chain fire at nominal fire_ms (gap: ms to the next one, if known), through the overlap
-- policy; updates the counters. Returns the outcome.
local function sched_fire(name, st, fire_ms, gap)
  local st_key = sched_key('sched:st:' .. name)
  local id = 's:' .. name .. ':' .. fmt(fire_ms)
  local outcome = sched_admit(name, st, id, fire_ms)
  if outcome == 'fire' then
    sched_offer(name, st, id, fire_ms, fire_ms + sched_jitter(name, st, fire_ms, gap))
    redis.call('HSET', st_key, 'pend', id, 'prev_ms', st.last_ms or '0', 'last_ms', fmt(fire_ms))
    st.last_ms = fmt(fire_ms)
  elseif outcome == 'held' then
    redis.call('HSET', st_key, 'last_ms', fmt(fire_ms))
    st.last_ms = fmt(fire_ms)
  else
    redis.call('HINCRBY', st_key, 'skipped', 1)
    redis.call('HSET', st_key, 'last_out', 'skipped')
  end
  if outcome ~= 'skipped' then
    st.fired = redis.call('HINCRBY', st_key, 'fired', 1)
  end
  return outcome
end

-- Release a fire held by the overlap policy once the schedule has none alive.
local function sched_release(name, now)
  local entry = redis.call('LPOP', sched_key('sched:buf:' .. name))
  if not entry then return end
  local st = sched_state(name)
  if not st.ver or st.gone == '1' then return end
  local id, fire_ms = string.match(entry, '^(.*)|(%d+)$')
  sched_offer(name, st, id, tonumber(fire_ms), now)
end

-- [S] hook: tasks that ended for good (outcome 'ok', 'dead', 'cancelled', 'expired',
-- 'purged'). O(1) for a queue without schedule fires: one EXISTS per script call.
local function task_ended(ids, now, outcome)
  if sched_memo.none or #ids == 0 then return end
  local fires = sched_key('sched:fire')
  if sched_memo.none == nil then
    sched_memo.none = redis.call('EXISTS', fires) == 0
    if sched_memo.none then return end
  end
  local names = redis.call('HMGET', fires, unpack(ids))
  for k, name in ipairs(names) do
    if name then
      redis.call('HDEL', fires, ids[k])
      local st_key = sched_key('sched:st:' .. name)
      if redis.call('EXISTS', st_key) == 1 then
        local live = redis.call('HINCRBY', st_key, 'live', -1)
        if live < 0 then
          redis.call('HSET', st_key, 'live', 0)
          live = 0
        end
        redis.call('HSET', st_key, 'last_out', outcome, 'last_end', fmt(now))
        if outcome == 'ok' then redis.call('HSET', st_key, 'last_ok', fmt(now)) end
        if outcome == 'expired' then redis.call('HINCRBY', st_key, 'missed', 1) end
        if live == 0 then sched_release(name, now) end
      end
    end
  end
end

-- Drop a schedule's chain fire that is not due yet (jittered): an edit or removal replaces it.
local function sched_drop_pending(name, now)
  local st_key = sched_key('sched:st:' .. name)
  local id = redis.call('HGET', st_key, 'pend')
  if not id then return end
  local s = redis.call('ZSCORE', K_DELAYED, id)
  if s and ms_of(s) > now then
    redis.call('ZREM', K_DELAYED, id)
    forget(id, now, false)
    task_ended({id}, now, 'cancelled')
    -- Never handed out and gone in this same script: it did not fire, and its time may
    -- fire again (under the new spec, or after a resume) instead of being lost to the edit.
    local nominal = tonumber(string.match(id, ':(%d+)$'))
    local state = redis.call('HMGET', st_key, 'cursor', 'last_ms', 'prev_ms')
    if nominal and tonumber(state[1]) == nominal then
      redis.call('HSET', st_key, 'cursor', fmt(nominal - 1))
    end
    if nominal and tonumber(state[2]) == nominal then
      redis.call('HSET', st_key, 'last_ms', state[3] or '0')
    end
    redis.call('HINCRBY', st_key, 'fired', -1)
  end
end

-- The next nominal time after the cursor (nil: not known yet, a cron schedule whose times
-- ahead ran out), and whether the schedule is over (end or max_fires reached).
local function sched_next(name, st)
  local endms, maxf = tonumber(st['end']), tonumber(st.maxf)
  if maxf > 0 and tonumber(st.fired) >= maxf then return nil, true end
  local nxt
  if st.kind == 'every' then
    nxt = sched_every_after(st, tonumber(st.cursor))
  else
    local head = redis.call('ZRANGE', sched_key('sched:at:' .. name), 0, 0)
    nxt = head[1] and tonumber(head[1])
    if not nxt then return nil, st.exh == '1' end
  end
  if endms > 0 and nxt > endms then return nil, true end
  return nxt, false
end

-- Put the schedule back in the wake plan at its next time; true if it needs cron times.
local function sched_plan(name, st, now)
  local due_key = sched_key('sched:due')
  local nxt, over = sched_next(name, st)
  if over then
    redis.call('HSET', sched_key('sched:st:' .. name), 'done', 1)
    redis.call('ZREM', due_key, name)
    return false
  end
  if not nxt then  -- starved of cron times: look again in a second, asking for more each time
    redis.call('ZADD', due_key, fmt(now + 1000), name)
    return true
  end
  -- Sleeping consumers plan their wake from the earliest time they heard of: a schedule
  -- that now fires before the chain's earliest (an upsert, a resume) is announced.
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  local step_at = nxt - sched_lead(st)
  redis.call('ZADD', due_key, fmt(step_at), name)
  announce_if_earlier(score(step_at, 0), head[2] and score(tonumber(head[2]), 0))
  return st.kind == 'cron' and st.exh ~= '1'
    and redis.call('ZCARD', sched_key('sched:at:' .. name)) < SCHED_LOW
end

-- One step of one due schedule: the times from the cursor to now, through the catch-up
-- policy, then the overlap policy; the cursor moves past them in the same script, so a time
-- is accepted once and refused for ever after. Returns true if it needs cron times.
local function sched_advance(name, now)
  local st = sched_state(name)
  if not st.ver or st.gone == '1' or st.paused == '1' or st.done == '1' then
    redis.call('ZREM', sched_key('sched:due'), name)
    return false
  end
  local cursor, endms = tonumber(st.cursor), tonumber(st['end'])
  local last = now + sched_lead(st)  -- the time coming up within the lead is made now
  if endms > 0 and endms < last then last = endms end
  local keep = st.cu == 'all' and SCHED_MAX_REPLAY or 1
  local win = tonumber(st.win)
  if st.cu == 'skip' and win == 0 then win = SCHED_GRACE_MS end
  local picked, total, newest = {}, 0, nil
  local at_key = sched_key('sched:at:' .. name)
  local every = tonumber(st.every)
  if st.kind == 'every' then
    local first = sched_every_after(st, cursor)
    if first <= last then
      newest = first + math.floor((last - first) / every) * every
      total = (newest - first) / every + 1
      for t = newest - (math.min(total, keep) - 1) * every, newest, every do
        picked[#picked + 1] = t
      end
    end
  else
    local due = redis.call('ZRANGEBYSCORE', at_key, '(' .. fmt(cursor), fmt(last))
    total = #due
    for i = math.max(1, total - keep + 1), total do picked[#picked + 1] = tonumber(due[i]) end
    if total > 0 then newest = tonumber(due[total]) end
    redis.call('ZREMRANGEBYSCORE', at_key, '-inf', fmt(last))
  end
  local maxf = tonumber(st.maxf)
  local missed = total - #picked
  if newest then
    st.cursor = fmt(newest)
    redis.call('HSET', sched_key('sched:st:' .. name), 'cursor', st.cursor)
    for k, t in ipairs(picked) do
      if (win > 0 and now - t > win) or (maxf > 0 and tonumber(st.fired) >= maxf) then
        missed = missed + 1
      else
        local gap = picked[k + 1] and picked[k + 1] - t
        if not gap and st.kind == 'every' then gap = every end
        if not gap then
          local head = redis.call('ZRANGE', at_key, 0, 0)
          gap = head[1] and tonumber(head[1]) - t
        end
        sched_fire(name, st, t, gap)
      end
    end
  end
  if missed > 0 then
    redis.call('HINCRBY', sched_key('sched:st:' .. name), 'missed', missed)
    redis.call('HSET', sched_key('sched:st:' .. name), 'last_out', 'missed')
  end
  return sched_plan(name, st, now)
end

-- Dead-letter a task. Its dedup key is freed for new offers, but the task keeps its key record
-- (taskkeys) so that requeue can take the key back.
local function bury(id, slot, now, err)
  redis.call('ZADD', K_DEAD, fmt(score(now, slot)), id)
  if err and err ~= '' then redis.call('HSET', K_ERRORS, id, err) end
  redis.call('ZREM', K_EXPIRY, id)
  local v = redis.call('HGET', K_TASKKEY, id)
  if v then
    local key = string.sub(v, string.find(v, '|', 1, true) + 1)
    if redis.call('HGET', K_KEYMAP, key) == id then redis.call('HDEL', K_KEYMAP, key) end
  end
  count('dead_lettered', 1)
  task_ended({id}, now, 'dead')
end

-- The lease score if token holds an unexpired lease on id, else nil.
local function held_lease(id, token, now)
  if redis.call('HGET', K_LEASES, id) ~= token then return nil end
  local s = redis.call('ZSCORE', K_INFLIGHT, id)
  if not s or ms_of(s) < now then return nil end
  return tonumber(s)
end

local function drop_lease(id)
  redis.call('ZREM', K_INFLIGHT, id)
  redis.call('HDEL', K_LEASES, id)
end

-- The ids and lease tokens of the (id, token) pairs in ARGV from position ``from`` on.
local function id_token_pairs(from)
  local ids, tokens = {}, {}
  for i = from, #ARGV, 2 do
    ids[#ids + 1] = ARGV[i]
    tokens[#tokens + 1] = ARGV[i + 1]
  end
  return ids, tokens
end

-- Finish the tasks whose leases the caller holds (ids[k] with tokens[k]): one status per
-- pair, 1 = finished, 0 = lease lost; and how many were finished.
local function finish(ids, tokens, now)
  -- Read every lease at once, then remove the finished tasks with one command per structure.
  local leases = redis.call('HMGET', K_LEASES, unpack(ids))
  local expiries = redis.call('ZMSCORE', K_INFLIGHT, unpack(ids))
  local reply, done, seen = {}, {}, {}
  for k, id in ipairs(ids) do
    if leases[k] == tokens[k] and expiries[k] and ms_of(expiries[k]) >= now and not seen[id] then
      seen[id] = true
      done[#done + 1] = id
      reply[k] = 1
    else
      reply[k] = 0
    end
  end
  if #done > 0 then
    -- Most queues keep no dedup keys, errors or ttls: one look tells, and the per-id work on
    -- those structures is skipped.
    if redis.call('EXISTS', K_TASKKEY, K_ERRORS, K_EXPIRY) > 0 then
      if redis.call('EXISTS', K_TASKKEY) == 1 then
        local keyed = redis.call('HMGET', K_TASKKEY, unpack(done))
        for k, id in ipairs(done) do
          if keyed[k] then release_key(id, now, true) end
        end
      end
      if redis.call('EXISTS', K_ERRORS) == 1 then redis.call('HDEL', K_ERRORS, unpack(done)) end
      if redis.call('EXISTS', K_EXPIRY) == 1 then redis.call('ZREM', K_EXPIRY, unpack(done)) end
    end
    redis.call('ZREM', K_INFLIGHT, unpack(done))
    lease_ended(done, now)
    redis.call('HDEL', K_LEASES, unpack(done))
    redis.call('HDEL', K_TASKS, unpack(done))
    redis.call('HDEL', K_ATTEMPTS, unpack(done))
    task_ended(done, now, 'ok')
    limit_keys_forget(done)
  end
  return reply, #done
end
local function land_task(id, due_ms, envelope, err, now)
  -- Write one task moved in from another queue system (redisson_move.lua and
  -- redisson_land.lua): pending until due_ms, or dead-lettered at once with err when it
  -- could not be decoded. Returns 1 = written pending, 2 = written dead, 3 = the id is
  -- taken (nothing written). (The comment is inside: a comment above a function would be
  -- carried by the function before it into every script that uses that one.)
  if redis.call('HSETNX', K_TASKS, id, envelope) == 0 then return 3 end
  if err ~= '' then
    bury(id, 9, now, err)
    return 2
  end
  redis.call('ZADD', K_DELAYED, fmt(score(due_ms, 9)), id)
  count('offered', 1)
  return 1
end

-- Outbox receipts. An outbox row carries a unique apply id; the script that applies it
-- (offer, cancel, reschedule) records the id in the shard's applied set (a ZSET id -> ms
-- until which it is kept, passed as an extra key) in the same atomic step, and refuses the
-- id while it is there: a relay that wrote, failed to commit and retries, or a second relay
-- that claimed the same row, changes nothing. Expired receipts go on each use. A refusal is
-- counted (applied_before): a write, so a WAIT after it also confirms the first application.
local function unapplied(applied, apply_ids, now)
  redis.call('ZREMRANGEBYSCORE', applied, '-inf', now)
  local found = redis.call('ZMSCORE', applied, unpack(apply_ids))
  local fresh, refused = {}, 0
  for i = 1, #apply_ids do
    fresh[i] = not found[i]
    if found[i] then refused = refused + 1 end
  end
  count('applied_before', refused)
  return fresh
end

local function record_applied(applied, apply_ids, now, keep_ms)
  if #apply_ids == 0 then return end
  local fields = {}
  for _, apply_id in ipairs(apply_ids) do
    fields[#fields + 1] = fmt(now + keep_ms)
    fields[#fields + 1] = apply_id
  end
  redis.call('ZADD', applied, unpack(fields))
end
