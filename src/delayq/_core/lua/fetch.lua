-- fetch: hand out up to COUNT due tasks, after bounded housekeeping.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] count: most tasks to hand out
-- ARGV[2] lease_ms: visibility timeout; 0 = at-most-once (a task handed out is gone)
-- ARGV[3] nonce: unique per call; lease tokens are nonce-i
-- ARGV[4] max_attempts   ARGV[5] backoff base ms   ARGV[6] backoff cap ms
-- ARGV[7] backoff factor in (0, 1], the client's jitter draw
-- ARGV[8] housekeeping limit: most expired leases / ttls / kept keys handled per call
-- ARGV[9] ms to keep this call's receipt
-- ARGV[10] the consumer (host/pid), for the task histories of a queue that keeps them
-- ARGV[11..] pairs: id, lease token of tasks to ack first (as ack.lua does): a consumer that
--         finishes one task and wants the next pays one round trip, not two
-- KEYS[14] this call's receipt: first "#" and the ack statuses, then per task handed out
--         "id|due_ms|slot|attempts|token" (and, at-most-once, the envelope and what the
--         offer gave as the next two entries). The same call resent after a lost
--         reply (same nonce: by delayq or the client's own retry) returns what the first one
--         handed out, instead of leasing more and leaving those to expire unseen (or,
--         at-most-once, losing them)
-- KEYS[15..24] the feature keys (keys.py FEATURE_ROLES: read by the plain variant)
-- Counters: besides delivered/expired/lease_expired, every call sets seen_ms (the last time a
--         consumer looked) and each task handed out adds its lateness (now - due) to
--         late:sum and to one non-cumulative bucket late:<upper ms> / late:inf; the bounds
--         are LATENESS_BUCKETS_MS in protocol.py.
-- Reply: {now_us, next_wake_ms or -1, ack statuses (a string of digits, 1 = acked, 0 = lease
--        lost, as ack.lua's), then per task: id, envelope, attempts, due_ms, slot, token}
--        (at-most-once, no lease: in token's place "key_ttl ms,ttl deadline ms,limit key",
--        or '' when the offer gave none of them)
--        now_us is the server's time in microseconds (consumers plan their sleep from it);
--        next_wake_ms is the earliest due time or lease expiry still ahead (or [S] the next
--        schedule fire, or [L] a gate's opening). [S] A trailing array, after the task
--        groups (so the reply's length is 3 + 6k + 1), names the schedules short of cron
--        times ahead: the client computes and writes more (schedule_refill.lua).
-- [L] Paused (limit_pause.lua): acks and housekeeping run, nothing is handed out, and
--        next_wake_ms is the pause's end, or -1 until resumed (resume announces "due now").
local want = tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local nonce = ARGV[3]
local max_attempts = tonumber(ARGV[4])
local base, cap, factor = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local limit = tonumber(ARGV[8])
local LATE_BOUNDS = {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000}
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now = math.floor(now_us / 1000)
local paused, paused_until = queue_pause_state(now)
flow_probe()  -- [L]
local h = hist_settings()  -- [H] no command more: flow_probe's EXISTS told
local limited = not paused and (flow_seen.lim or flow_seen.task)  -- limits or limit keys
local star_wait, charged = nil, nil  -- [L] when '*' may hand out again; the keys charged
local in_line = false  -- [L] keyed tasks wait in their keys' lines (lim:ready)
local old_head = head_score(K_DELAYED)
local new_min = nil

-- Leases that ran out: deliver again after backoff, or dead-letter on the last attempt.
local lapsed = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', '(' .. fmt(score(now, 0)),
  'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #lapsed, 2 do
  local id, slot = lapsed[i], slot_of(lapsed[i + 1])
  drop_lease(id)
  lease_ended({id}, now)
  local attempts = tonumber(redis.call('HGET', K_ATTEMPTS, id) or '0')
  local err = 'lease expired on attempt ' .. attempts
  if attempts >= max_attempts then
    bury(id, slot, now, err)
  else
    local s = score(now + backoff_ms(attempts, base, cap, factor), slot)
    redis.call('ZADD', K_DELAYED, fmt(s), id)
    redis.call('HSET', K_ERRORS, id, err)
    if not new_min or s < new_min then new_min = s end
    if h then hist_add(h, id, now, 'retried', attempts, err) end
  end
end
count('lease_expired', #lapsed / 2)

-- Tasks whose ttl ran out before anyone took them.
local has_expiry = expiry_exists()
if has_expiry then
  local stale = redis.call('ZRANGEBYSCORE', K_EXPIRY, '-inf', '(' .. fmt(now), 'LIMIT', 0, limit)
  local expired = 0
  for _, id in ipairs(stale) do
    if redis.call('ZREM', K_DELAYED, id) == 1 or unpark(id) then
      hist_ended({id}, now, 'expired', 'its ttl ran out before a delivery')
      forget(id, now, false)
      task_ended({id}, now, 'expired')
      expired = expired + 1
    else
      redis.call('ZREM', K_EXPIRY, id)
    end
  end
  count('expired', expired)
end

-- Dedup keys whose keep-window closed.
local kept = redis.call('ZRANGEBYSCORE', K_KEPT, '-inf', fmt(now), 'LIMIT', 0, limit)
for _, key in ipairs(kept) do
  redis.call('ZREM', K_KEPT, key)
  local id = redis.call('HGET', K_KEYMAP, key)
  if id and redis.call('HEXISTS', K_TASKS, id) == 0 then redis.call('HDEL', K_KEYMAP, key) end
end

-- [S] The schedule step: the fires that came due, in the chain's wake plan (sched:due); a
-- queue's pause holds its fires back.
local sched_on, sched_low = sched_probe(), nil
if sched_on and not paused then
  local names = redis.call('ZRANGEBYSCORE', sched_key('sched:due'), '-inf', fmt(now),
    'LIMIT', 0, limit)
  for _, name in ipairs(names) do
    if sched_advance(name, now) then
      sched_low = sched_low or {}
      sched_low[#sched_low + 1] = name
    end
  end
end

local receipt, keep_ms = KEYS[14], tonumber(ARGV[9])

local function next_wake()
  if paused then return paused_until > 0 and paused_until or -1 end  -- [L] resume announces
  local next_due = (not star_wait) and head_score(K_DELAYED)  -- [L] '*' blocked: not due
  if star_wait and star_wait > 0 then next_due = score(star_wait, 0) end
  if in_line and not star_wait and redis.call('EXISTS', flow_key('lim:ready')) == 1 then
    next_due = score(now, 0)  -- [L] keys in line: more to hand out now
  end
  if limited then  -- [L] the next gate time of a parked key
    local gate = redis.call('ZRANGE', flow_key('lim:gate'), 0, 0, 'WITHSCORES')[2]
    if gate and (not next_due or score(tonumber(gate), 0) < next_due) then
      next_due = score(tonumber(gate), 0)
    end
  end
  local next_lapse = head_score(K_INFLIGHT)
  local wake = -1
  if next_due then wake = ms_of(next_due) end
  if next_lapse then
    local lapse = ms_of(next_lapse) + 1
    if wake < 0 or lapse < wake then wake = lapse end
  end
  local fire = sched_on and not paused and head_score(sched_key('sched:due'))  -- [S]
  if fire and (wake < 0 or fire < wake) then wake = fire end
  return wake
end

if redis.call('EXISTS', receipt) == 1 then
  local rows = redis.call('LRANGE', receipt, 0, -1)
  local reply = {now_us, next_wake(), string.sub(rows[1], 2)}
  local r = 2
  while r <= #rows do
    local id, due_ms, slot, tries, token = string.match(rows[r], '^(.*)|(%d+)|(%d)|(%d+)|(.*)$')
    local envelope
    if lease_ms > 0 then  -- only if the lost reply's lease still holds
      envelope = redis.call('HGET', K_LEASES, id) == token and redis.call('HGET', K_TASKS, id)
      r = r + 1
    else
      envelope, token = rows[r + 1], rows[r + 2]
      r = r + 3
    end
    if envelope then
      local n = #reply
      reply[n + 1] = id
      reply[n + 2] = envelope
      reply[n + 3] = tonumber(tries)
      reply[n + 4] = tonumber(due_ms)
      reply[n + 5] = tonumber(slot)
      reply[n + 6] = token
    end
  end
  return reply
end

redis.call('HSET', K_COUNTERS, 'seen_ms', now)

local acks = ''
if #ARGV > 10 then
  local ack_ids, tokens = id_token_pairs(11)
  local statuses, done = finish(ack_ids, tokens, now)
  count('acked', done)
  acks = table.concat(statuses)
end

local reply = {now_us, -1, acks}
if paused then want = 0 end  -- [L] a paused queue hands out nothing; acks still land
local due = {}
if want > 0 and limited then  -- [L] limits: over-limit tasks parked, the rest handed out
  due, charged, star_wait = limited_due(want, limit, now_us, lease_ms > 0)
  in_line = flow_seen.task or flow_seen.ready
elseif want > 0 then
  due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', fmt(score(now, 9)),
    'WITHSCORES', 'LIMIT', 0, want)
end
local ids = {}
for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
local handed = 0
if #ids > 0 then
  -- One command per structure for the whole batch, not one per task.
  redis.call('ZREM', K_DELAYED, unpack(ids))
  local envelopes = redis.call('HMGET', K_TASKS, unpack(ids))
  local attempts = redis.call('HMGET', K_ATTEMPTS, unpack(ids))
  local deadlines = {}
  if has_expiry then
    deadlines = redis.call('ZMSCORE', K_EXPIRY, unpack(ids))
    redis.call('ZREM', K_EXPIRY, unpack(ids))
  end
  local attempt_fields, lease_fields, inflight_fields = {}, {}, {}
  local late_sum, late_hits = 0, {}
  for k, id in ipairs(ids) do
    local s, envelope = due[2 * k], envelopes[k]
    local alive = envelope ~= false
    if alive and deadlines[k] and tonumber(deadlines[k]) < now then
      hist_ended({id}, now, 'expired', 'its ttl ran out before a delivery')
      forget(id, now, false)
      task_ended({id}, now, 'expired')
      count('expired', 1)
      alive = false
    end
    if alive then
      handed = handed + 1
      local late = now - ms_of(s)
      if late < 0 then late = 0 end
      late_sum = late_sum + late
      local bucket = 'inf'
      for _, bound in ipairs(LATE_BOUNDS) do
        if late <= bound then bucket = bound break end
      end
      late_hits[bucket] = (late_hits[bucket] or 0) + 1
      local slot = slot_of(s)
      local tries = tonumber(attempts[k] or '0') + 1
      if h then  -- [H] at-most-once, the delivery ends the task
        hist_add(h, id, now, 'delivered', tries,
          'to ' .. ARGV[10] .. (late > 0 and (', ' .. hist_span(late) .. ' late') or ''),
          lease_ms == 0)
      end
      local token = ''
      if lease_ms > 0 then
        token = nonce .. '-' .. handed
        attempt_fields[#attempt_fields + 1] = id
        attempt_fields[#attempt_fields + 1] = tries
        lease_fields[#lease_fields + 1] = id
        lease_fields[#lease_fields + 1] = token
        inflight_fields[#inflight_fields + 1] = fmt(score(now + lease_ms, slot))
        inflight_fields[#inflight_fields + 1] = id
      else
        -- At most once, the task leaves Redis here. What its offer gave it beyond the
        -- envelope goes to the client, which needs it to put the task back if close() finds
        -- it not handed out: "key_ttl ms,ttl deadline ms,limit key" ('' when none).
        local line = flow_seen.task and redis.call('HGET', flow_key('lim:task'), id) or ''
        local key_ttl, deadline = forget(id, now, true), deadlines[k] or ''
        if key_ttl > 0 or deadline ~= '' or line ~= '' then
          token = key_ttl .. ',' .. deadline .. ',' .. line
        end
        task_ended({id}, now, 'ok')
      end
      local n = #reply
      reply[n + 1] = id
      reply[n + 2] = envelope
      reply[n + 3] = tries
      reply[n + 4] = ms_of(s)
      reply[n + 5] = slot
      reply[n + 6] = token
    end
  end
  if #lease_fields > 0 then
    redis.call('HSET', K_ATTEMPTS, unpack(attempt_fields))
    redis.call('HSET', K_LEASES, unpack(lease_fields))
    redis.call('ZADD', K_INFLIGHT, unpack(inflight_fields))
  end
  if handed > 0 then
    for bucket, n in pairs(late_hits) do count('late:' .. bucket, n) end
    count('late:sum', late_sum)
  end
end
if limited then limits_charge(reply, charged, lease_ms > 0) end  -- [L]
count('delivered', handed)

if handed > 0 or acks ~= '' then
  local rows = {'#' .. acks}
  for r = 4, #reply, 6 do
    rows[#rows + 1] = reply[r] .. '|' .. reply[r + 3] .. '|' .. reply[r + 4] .. '|'
      .. reply[r + 2] .. '|' .. (lease_ms > 0 and reply[r + 5] or '')
    if lease_ms == 0 then  -- the envelope and what the offer gave (a limit key has any byte)
      rows[#rows + 1] = reply[r + 1]
      rows[#rows + 1] = reply[r + 5]
    end
  end
  redis.call('RPUSH', receipt, unpack(rows))
  redis.call('PEXPIRE', receipt, keep_ms)
end

announce_if_earlier(new_min, old_head)

reply[2] = next_wake()
if sched_low then reply[#reply + 1] = sched_low end  -- [S] schedules short of cron times
return reply
