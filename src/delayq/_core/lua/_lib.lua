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
local flow_seen = {}  -- [L] per call: which flow-control keys exist (see flow_probe)
local UNKEYED = '~none'  -- [L] the line of tasks offered without a limit key to a keyed queue
local fair_memo = {}  -- [L] per call: the virtual time, read once (it changes only at the end)
local hist_conf = nil  -- [H] per call: the queue's history settings, false when off
local plain_seen = {}  -- per call: what the plain scripts' first look found (_plain.lua)

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

-- Whether the queue holds tasks with a ttl (the fetch's look).
local function expiry_exists() return redis.call('EXISTS', K_EXPIRY) == 1 end

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

-- [L] n tasks of limit key held back for reason: the queue's count and the key's (a sorted
-- set per reason, so stats reads the keys with the most in O(log K)).
local function count_throttled(key, reason, n)
  if n == 0 then return end
  count('throttled:' .. reason, n)
  redis.call('ZINCRBY', flow_key('lim:thr:' .. reason), n, key)
end

-- Which flow-control state the queue has (pause, limits, keys in line, holds or gates, held
-- slots, tasks' limit keys): one EXISTS for a queue that uses none of it; otherwise each
-- field is looked up the first time a step asks (flow_seen.lim: limits, keys in line, a
-- hold or a gate, so fetch takes the limited path), once per call.
-- [H] The same EXISTS tells whether the queue keeps task histories (flow_seen.hist): it
-- names the history settings key more times than there are flow-control keys, and EXISTS
-- counts a key each time it is named, so the count tells both apart.
local function flow_probe()
  if rawget(flow_seen, 'any') ~= nil then return end
  -- The keys behind each of flow_seen's fields (roles under the queue's prefix); made here,
  -- not in the preamble, so that the scripts that never probe do not build it every call.
  local FLOW_KEYS = {pause = {'pause'}, limits = {'lim'}, ready = {'lim:ready'},
    gated = {'lim:hold', 'lim:gate'}, held = {'lim:held'}, task = {'lim:task'}}
  local all = {}
  for _, roles in pairs(FLOW_KEYS) do
    for _, role in ipairs(roles) do all[#all + 1] = flow_key(role) end
  end
  local weight = #all + 1
  for _ = 1, weight do all[#all + 1] = flow_key('hist') end
  local found = redis.call('EXISTS', unpack(all))
  local any = found % weight > 0
  flow_seen.any = any
  flow_seen.hist = found >= weight
  setmetatable(flow_seen, {__index = function(seen, field)
    local found = false
    if any and field == 'lim' then
      found = seen.limits or seen.ready or seen.gated
    elseif any and FLOW_KEYS[field] then
      local keys = {}
      for _, role in ipairs(FLOW_KEYS[field]) do keys[#keys + 1] = flow_key(role) end
      found = redis.call('EXISTS', unpack(keys)) > 0
    end
    rawset(seen, field, found)
    return found
  end})
end

-- [H] Task history (issue #22, docs/history.md), opt-in per queue. Its keys hang off the
-- queue's prefix, so they share its hash tag:
--   hist       HASH ret (ms a history is kept once its task ended), max (events kept per
--              task), bytes (most bytes of an event's detail). Absent: history is off.
--   hist:<id>  LIST one task's events, oldest first, each 'ms|kind|attempt|detail'; no
--              expiry while the task lives, the retention from its end
-- Each event is written by the script that makes the change it records, in the same atomic
-- step. The counters hash's field 'hist' mirrors the settings' presence for the offer
-- scripts, whose one look at counters (HMGET retired hist) then costs no other command.

-- The history settings ({ret, max, bytes}) or false; known: the caller saw the mirror.
local function hist_settings(known)
  if hist_conf == nil then
    if not known then flow_probe() end
    hist_conf = false
    if known or flow_seen.hist then
      local v = redis.call('HMGET', flow_key('hist'), 'ret', 'max', 'bytes')
      if v[1] then
        hist_conf = {ret = tonumber(v[1]), max = tonumber(v[2]), bytes = tonumber(v[3])}
      end
    end
  end
  return hist_conf
end

-- A detail on one line, cut to n bytes at a character boundary (ending in an ellipsis).
local function hist_cut(text, n)
  text = string.gsub(text, '%s+', ' ')
  if #text <= n then return text end
  local cut = n - 3
  while cut > 0 and string.byte(text, cut + 1) >= 128 and string.byte(text, cut + 1) < 192 do
    cut = cut - 1
  end
  return string.sub(text, 1, cut) .. '\226\128\166'
end

-- A duration as timing.format_duration writes it: 250ms, 4.2s, 5m03s, 2h05m, 3d04h.
local function hist_span(ms)
  if ms < 1000 then return string.format('%dms', ms) end
  if ms < 60000 then return string.format('%.1fs', ms / 1000) end
  local s = math.floor(ms / 1000)
  if s < 3600 then return string.format('%dm%02ds', math.floor(s / 60), s % 60) end
  if s < 86400 then
    return string.format('%dh%02dm', math.floor(s / 3600), math.floor(s % 3600 / 60))
  end
  return string.format('%dd%02dh', math.floor(s / 86400), math.floor(s % 86400 / 3600))
end

local function hist_due(due, now)
  if due <= now then return 'due now' end
  return 'due in ' .. hist_span(due - now)
end

-- Record one event of task id (h: the settings). ends: the task left the queue for good,
-- so its history is kept for the retention from now.
local function hist_add(h, id, now, kind, attempt, detail, ends)
  local key = flow_key('hist:' .. id)
  local n = redis.call('RPUSH', key, fmt(now) .. '|' .. kind .. '|' .. (attempt or 0) .. '|'
    .. hist_cut(detail or '', h.bytes))
  if n > h.max then
    -- Keep the first event (the offer) and the latest ones; the second entry counts those
    -- dropped (at the time of the last), however far over max the list is (max lowered).
    local head = redis.call('LRANGE', key, 0, 1)
    local before = tonumber(string.match(head[2], '^%d+|trimmed|%d+|(%d+)$') or '0')
    local last_dropped = redis.call('LINDEX', key, -(h.max - 1))
    redis.call('LTRIM', key, -(h.max - 2), -1)
    local dropped = before + (n - 1 - (before > 0 and 1 or 0)) - (h.max - 2)
    redis.call('LPUSH', key, string.match(last_dropped, '^%d+') .. '|trimmed|0|' .. dropped,
      head[1])
  end
  if ends then
    redis.call('PEXPIRE', key, h.ret)
  elseif n > 1 and (kind == 'offered' or kind == 'dead-lettered') then
    redis.call('PERSIST', key)  -- back after an end (an id offered again, an undecodable
  end                           -- at-most-once task buried): it lives again
end

-- Record one event of a live task, its attempt (deliveries so far) read unless given.
local function hist_note(id, now, kind, detail, attempt)
  local h = hist_settings()
  if not h then return end
  hist_add(h, id, now, kind, attempt or redis.call('HGET', K_ATTEMPTS, id), detail, false)
end

-- Record that tasks ended (acked, cancelled, expired, purged): before their attempts go.
local function hist_ended(ids, now, kind, detail)
  local h = hist_settings()
  if not h or #ids == 0 then return end
  local tries = redis.call('HMGET', K_ATTEMPTS, unpack(ids))
  for k, id in ipairs(ids) do hist_add(h, id, now, kind, tries[k], detail, true) end
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
--   lim:tat    HASH limit key -> GCRA theoretical arrival time, epoch us; '~turn' -> the ms
--              the last consumer refused at '*' was told to look again
--   lim:run    HASH limit key -> leases held ('*': all leases handed out under limits)
--   lim:held   HASH task id -> the limit key its lease holds a slot of ('' = only '*')
--   lim:w:<k>  ZSET due task id of key k -> its score in the delayed set (order kept);
--              '~none' holds the tasks offered without a key, once any task has one
--   lim:ready  ZSET limit key -> virtual finish tag of its next task: the keys with tasks
--              waiting that may start one, served lowest tag first (fairness, below)
--   lim:vt     STRING the virtual time: the tag of the task handed out last
--   lim:gate   ZSET limit key -> ms its next task may run (a rate limit's exact retry-after
--              or a RateLimited hold's end; '*': when the queue may hand out again)
--   lim:full   SET limit keys at their concurrency cap with tasks waiting ('*' too)
--   lim:hold   HASH limit key -> ms until which a handler's RateLimited holds it ('*': a
--              task without a limit key raised it: the whole queue waits)
-- A key with tasks waiting is in exactly one of lim:ready, lim:gate and lim:full: it waits
-- for its turn, for a time, or for the next lease of its key to end.
--
-- Fairness is self-clocked fair queueing: a key joining lim:ready gets the tag vt + 1/weight
-- (served within one round, whatever the backlog of others), and each task handed out moves
-- its key's tag 1/weight further: keys share the hand-outs in proportion to their weights,
-- in O(log K) per key served. Runs of one key's tasks go out in one ZPOPMIN.

local function limit_of(spec)
  if not spec then return nil end
  local rate, per, burst, conc, weight =
    string.match(spec, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)')
  local lim = {conc = tonumber(conc), weight = tonumber(weight) or 1}
  if rate ~= '' then
    lim.rate = tonumber(rate)
    lim.t = tonumber(per) / lim.rate  -- emission interval, us
    lim.tau = lim.t * (tonumber(burst) - 1)  -- how far ahead of now the TAT may run
    lim.burst = tonumber(burst)
  end
  return lim
end

-- The limit that applies to key: its own, or (a task's key) the default.
local function limit_spec(key)
  local spec = redis.call('HGET', flow_key('lim'), key)
  if not spec and key ~= '*' and key ~= UNKEYED then
    spec = redis.call('HGET', flow_key('lim'), '~default')
  end
  return spec
end

local function parked_key(key) return flow_key('lim:w:' .. key) end

local function tag(x) return string.format('%.17g', x) end

-- key has tasks waiting and may start one: it takes its turn (a key already in line keeps
-- its place).
local function fair_join(key, weight)
  if not fair_memo.vt then fair_memo.vt = tonumber(redis.call('GET', flow_key('lim:vt')) or '0') end
  redis.call('ZADD', flow_key('lim:ready'), 'NX', tag(fair_memo.vt + 1 / (weight or 1)), key)
end

-- key may start tasks again (a gate opened, a slot freed, its limit changed): in line, if
-- it has any waiting.
local function fair_rejoin(key)
  if key == '*' or redis.call('EXISTS', parked_key(key)) == 0 then return end
  local lim = limit_of(limit_spec(key))
  fair_join(key, lim and lim.weight)
end

local function wake_now(now)
  local sharded = redis.REDIS_VERSION_NUM and string.sub(K_EVENTS, -8) == ':sevents'
  redis.call(sharded and 'SPUBLISH' or 'PUBLISH', K_EVENTS, fmt(now))
end

-- [L] hook: the leases of ids ended (ack, nack/retry/release/reject, lease expiry, purge).
-- Frees their concurrency slots; a key (or '*') at its cap with tasks waiting gets back in
-- line (the next fetch starts as many as slots are free), and the call sends one wake. One
-- EXISTS for a queue without limits.
local function lease_ended(ids, now)
  flow_probe()
  if not flow_seen.held or #ids == 0 then return end
  local held_key, run, full = flow_key('lim:held'), flow_key('lim:run'), flow_key('lim:full')
  local keys = redis.call('HMGET', held_key, unpack(ids))
  local gone, freed, wake = {}, {}, false
  for k, id in ipairs(ids) do
    local key = keys[k]
    if key then
      gone[#gone + 1] = id
      freed['*'] = (freed['*'] or 0) + 1
      if key ~= '' then freed[key] = (freed[key] or 0) + 1 end
    end
  end
  for key, n in pairs(freed) do  -- one count and one look per key, however many ended
    if redis.call('HINCRBY', run, key, -n) <= 0 then redis.call('HDEL', run, key) end
    if redis.call('SREM', full, key) == 1 then
      wake = true
      fair_rejoin(key)
    end
  end
  if #gone > 0 then redis.call('HDEL', held_key, unpack(gone)) end
  if wake then wake_now(now) end
end

-- [L] The fetch step of a queue with limits or limit keys: the due tasks (id, score pairs)
-- that may be handed out now, at most want. Keyed queues move their due tasks (at most
-- want + scan a call) into their keys' lines and serve the keys fairly; a key over its limit
-- leaves the line for lim:gate (until its exact retry-after) or lim:full. Nothing is counted
-- as an attempt. Returns the pairs, the limit key of each id handed (for limits_charge), and
-- when the whole queue ('*') may hand out next if it may not now (ms; -1: when a lease ends).
local function limited_due(want, scan, now_us, leased)
  flow_probe()
  local now = math.floor(now_us / 1000)
  local TAT, RUN, HOLD = flow_key('lim:tat'), flow_key('lim:run'), flow_key('lim:hold')
  local GATE, FULL, READY = flow_key('lim:gate'), flow_key('lim:full'), flow_key('lim:ready')
  local specs, tats, runs, holds, changed = {}, {}, {}, {}, {}
  local function limit_for(key)
    if specs[key] == nil then specs[key] = limit_of(limit_spec(key)) or false end
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
  -- How many of key's tasks may start now; 0 and why not: 'full' or the ms they may.
  local function allowance(key, lim)
    local hold = held_until(key)
    if hold > now then return 0, hold end
    if not lim then return math.huge end
    local n = math.huge
    if leased and lim.conc then
      n = lim.conc - running(key)
      if n <= 0 then return 0, 'full' end
    end
    if lim.rate then
      local allow = tat_of(key) - lim.tau  -- when the next one may start
      if allow > now_us then return 0, math.ceil(allow / 1000) end
      n = math.min(n, math.floor((now_us - allow) / lim.t) + 1)
    end
    return n
  end
  local function take(key, lim, n)
    if not lim then return end
    if lim.rate then
      tats[key] = tat_of(key) + n * lim.t
      changed[key] = true
    end
    runs[key] = running(key) + n
  end
  local star = limit_for('*')
  -- '*' may start none now: wake when a batch may start (the burst the limit allows anyway,
  -- no more than are waiting or this consumer asked for), so the consumers woken then fetch
  -- batches, not one task each.
  local function star_refused(why, waiting)
    if why ~= 'full' and star and star.rate and held_until('*') <= now then
      local batch = math.min(star.burst, waiting, want)
      if batch > 1 then why = math.ceil((tat_of('*') - star.tau + (batch - 1) * star.t) / 1000) end
      -- Consumers refused before then take turns, a batch each: each is told the time of
      -- the batch after the last one told, so one consumer, not all, wakes per batch.
      local told = tonumber(redis.call('HGET', TAT, '~turn') or '0')
      if told > now then why = math.max(why, told + math.ceil(batch * star.t / 1000)) end
      redis.call('HSET', TAT, '~turn', why)
    end
    if why == 'full' then
      redis.call('SADD', FULL, '*')
      return -1
    end
    redis.call('ZADD', GATE, why, '*')
    return why
  end
  local function save()
    for key in pairs(changed) do redis.call('HSET', TAT, key, fmt(math.ceil(tats[key]))) end
  end

  -- Keys whose gate time came get back in line.
  local opened = redis.call('ZRANGEBYSCORE', GATE, '-inf', now, 'LIMIT', 0, scan)
  if #opened > 0 then redis.call('ZREM', GATE, unpack(opened)) end
  for _, key in ipairs(opened) do fair_rejoin(key) end

  -- Keyed, every due task goes through its key's line: ten times the housekeeping bound a
  -- call (each task moves once), so a key's backlog is soon in line, not in front.
  local keyed = flow_seen.task or flow_seen.ready
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', fmt(score(now, 9)),
    'WITHSCORES', 'LIMIT', 0, want + (keyed and 10 * scan or scan))
  if not keyed then
    -- No task has a key: one line, the delayed set's own order; only '*' applies.
    if #due == 0 then return due, {}, nil end
    local n, why = allowance('*', star)
    if n == 0 then return {}, {}, star_refused(why, #due / 2) end
    n = math.min(n, want, #due / 2)
    local picked, charged = {}, {}
    for i = 1, 2 * n, 2 do
      picked[i], picked[i + 1] = due[i], due[i + 1]
      charged[due[i]] = ''
    end
    take('*', star, n)
    save()
    -- More are due than '*' allowed: the reply says when the next batch may start, so the
    -- consumers sleep until then instead of looking again at once.
    local more = #due / 2 - n
    if more > 0 then
      local _, why = allowance('*', star)
      if why then return picked, charged, star_refused(why, more) end
    end
    return picked, charged, nil
  end

  -- Keyed: the due tasks join their keys' lines; a key not gated or full takes its turn.
  local function held_back(key, reason, n)
    if key ~= UNKEYED then count_throttled(key, reason, n) else count('throttled:' .. reason, n) end
  end
  if #due > 0 then
    local ids = {}
    for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
    local keys = flow_seen.task and redis.call('HMGET', flow_key('lim:task'), unpack(ids)) or {}
    local lines, order = {}, {}
    for k, id in ipairs(ids) do
      local key = keys[k] or UNKEYED
      if not lines[key] then
        lines[key] = {}
        order[#order + 1] = key
      end
      local line = lines[key]
      line[#line + 1] = due[2 * k]
      line[#line + 1] = id
    end
    redis.call('ZREM', K_DELAYED, unpack(ids))
    for _, key in ipairs(order) do
      redis.call('ZADD', parked_key(key), unpack(lines[key]))
      if redis.call('ZSCORE', GATE, key) then
        held_back(key, 'rate', #lines[key] / 2)
      elseif redis.call('SISMEMBER', FULL, key) == 1 then
        held_back(key, 'concurrency', #lines[key] / 2)
      else
        local lim = limit_for(key)
        fair_join(key, lim and lim.weight)
      end
    end
  end

  local picked, charged, star_wait, vt = {}, {}, nil, nil
  local looks = 0
  while #picked < 2 * want and looks < want + scan do
    looks = looks + 1
    local top = redis.call('ZRANGE', READY, 0, 1, 'WITHSCORES')
    if #top == 0 then break end
    local star_n, star_why = allowance('*', star)
    if star_n == 0 then
      local waiting = 0
      for _, key in ipairs(redis.call('ZRANGE', READY, 0, (star and star.burst or 1) - 1)) do
        waiting = waiting + redis.call('ZCARD', parked_key(key))
      end
      star_wait = star_refused(star_why, waiting)
      break
    end
    local key, f = top[1], tonumber(top[2])
    local lim = limit_for(key)
    local n, why = allowance(key, lim)
    if n == 0 then
      redis.call('ZREM', READY, key)
      local reason = 'rate'
      if why == 'full' then
        redis.call('SADD', FULL, key)
        reason = 'concurrency'
      else
        redis.call('ZADD', GATE, why, key)
      end
      held_back(key, reason, redis.call('ZCARD', parked_key(key)))
    else
      local weight = lim and lim.weight or 1
      if top[3] then  -- the run of this key's tasks before the next key's turn
        n = math.min(n, math.floor((tonumber(top[4]) - f) * weight + 1e-9) + 1)
      end
      n = math.min(n, star_n, want - #picked / 2)
      local popped = redis.call('ZPOPMIN', parked_key(key), n)
      local got = #popped / 2
      for i = 1, #popped, 2 do
        picked[#picked + 1] = popped[i]
        picked[#picked + 1] = popped[i + 1]
        charged[popped[i]] = key == UNKEYED and '' or key
      end
      if got > 0 then
        take('*', star, got)
        take(key, lim, got)
        vt = f + (got - 1) / weight
      end
      if got == n and redis.call('EXISTS', parked_key(key)) == 1 then
        redis.call('ZADD', READY, tag(f + got / weight), key)
      else
        redis.call('ZREM', READY, key)
      end
    end
  end
  if vt then redis.call('SET', flow_key('lim:vt'), tag(vt)) end
  if redis.call('EXISTS', READY) == 0 then redis.call('DEL', flow_key('lim:vt')) end
  save()
  return picked, charged, star_wait
end

-- [L] After fetch handed tasks out under limits: each lease holds a slot of '*' and of its
-- key (the counts lease_ended gives back). At-most-once deliveries hold none.
local function limits_charge(reply, charged, leased)
  -- Keyed tasks count while no limit exists yet too: a concurrency limit set on their key
  -- later must see the leases already running.
  if not leased or not (flow_seen.limits or flow_seen.task) then return end
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
    redis.call('ZREM', flow_key('lim:ready'), key)  -- gated, out of line until the hold ends
    redis.call('SREM', flow_key('lim:full'), key)
  end
  count_throttled(key, 'ratelimited', 1)
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
  if not flow_seen.task and not flow_seen.ready then return nil end
  local key = flow_seen.task and redis.call('HGET', flow_key('lim:task'), id) or UNKEYED
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
-- Returns the task's key_ttl (0 without a dedup key).
local function release_key(id, now, remember)
  local v = redis.call('HGET', K_TASKKEY, id)
  if not v then return 0 end
  redis.call('HDEL', K_TASKKEY, id)
  local sep = string.find(v, '|', 1, true)
  local key_ttl = tonumber(string.sub(v, 1, sep - 1))
  local key = string.sub(v, sep + 1)
  if redis.call('HGET', K_KEYMAP, key) ~= id then return key_ttl end
  if remember and key_ttl > 0 then
    redis.call('ZADD', K_KEPT, fmt(now + key_ttl), key)
  else
    redis.call('HDEL', K_KEYMAP, key)
  end
  return key_ttl
end

-- Remove every trace of a task except its place in delayed/inflight/dead (the caller's job).
local function forget(id, now, remember_key)
  redis.call('HDEL', K_TASKS, id)
  redis.call('HDEL', K_LEASES, id)
  redis.call('HDEL', K_ATTEMPTS, id)
  redis.call('HDEL', K_ERRORS, id)
  redis.call('ZREM', K_EXPIRY, id)
  local key_ttl = release_key(id, now, remember_key)
  limit_keys_forget({id})
  return key_ttl
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
--   sched:reqs:<name> ZSET request -> until when it is remembered (a reshard carries them)
--   sched:gone       ZSET name -> until when a removed schedule's tombstone is kept
--   sched:away       STRING set while a reshard moves this (sub-)queue's schedules away
--   sched:mbuf:<name> LIST the held fires a reshard carried, kept with the tombstone

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
  if hist_settings() then
    local now = now_ms()
    hist_note(id, now, 'offered', 'by schedule ' .. name .. ', ' .. hist_due(due_ms, now), 0)
  end
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
    -- The held fire is dropped for this one: skipped, and a chain fire no longer counts
    -- towards max_fires (a trigger's never did).
    local st_key, chain = sched_key('sched:st:' .. name), 0
    for _, entry in ipairs(redis.call('LRANGE', buf, 0, -1)) do
      if not string.find(entry, ':m:', #name + 3, true) then chain = chain + 1 end
    end
    redis.call('DEL', buf)
    redis.call('HINCRBY', st_key, 'skipped', held)
    if chain > 0 then st.fired = redis.call('HINCRBY', st_key, 'fired', -chain) end
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

-- Release a fire held by the overlap policy once the schedule has none alive: due now, or
-- at its time if it was held while made ahead of it (never early); not while the schedule
-- is paused.
local function sched_release(name, now)
  local buf = sched_key('sched:buf:' .. name)
  local entry = redis.call('LPOP', buf)
  if not entry then return end
  local st = sched_state(name)
  if not st.ver or st.gone == '1' then return end
  if st.paused == '1' then  -- held on: the resume releases it
    redis.call('LPUSH', buf, entry)
    return
  end
  local id, fire_ms = string.match(entry, '^(.*)|(%d+)$')
  sched_offer(name, st, id, tonumber(fire_ms), math.max(now, tonumber(fire_ms)))
end

-- [S] The fetch's look at the schedules: whether fires are due in the chain's wake plan
-- (sched:due). One EXISTS for a queue without schedules, which task_ended then skips.
local function sched_probe()
  local due = sched_key('sched:due')
  if redis.call('EXISTS', due, sched_key('sched:fire')) == 0 then
    sched_memo.none = true
    return false
  end
  return redis.call('EXISTS', due) == 1
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
    hist_ended({id}, now, 'cancelled', 'its schedule changed')
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
    -- Not fired: a schedule that max_fires ended with it is not over (planned again).
    redis.call('HINCRBY', st_key, 'fired', -1)
    redis.call('HSET', st_key, 'done', 0)
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
  -- A schedule a reshard carried here counts its fires still alive on the old side as
  -- running (schedule_move.lua): it is looked at each second, and the fetch reply asks the
  -- consumer to see which of them ended there, until none is left.
  local far = tonumber(st.far or '0') > 0
  if far and step_at > now + 1000 then step_at = now + 1000 end
  redis.call('ZADD', due_key, fmt(step_at), name)
  announce_if_earlier(score(step_at, 0), head[2] and score(tonumber(head[2]), 0))
  return far or (st.kind == 'cron' and st.exh ~= '1'
    and redis.call('ZCARD', sched_key('sched:at:' .. name)) < SCHED_LOW)
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
local function bury(id, slot, now, err, why)
  redis.call('ZADD', K_DEAD, fmt(score(now, slot)), id)
  hist_note(id, now, 'dead-lettered', (why and why ~= '') and why or err)  -- why: err's gist
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
    hist_ended(done, now, 'acked')
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
  hist_note(id, now, 'offered', 'moved from Redisson, ' .. hist_due(due_ms, now), 0)
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
