-- redisson_move: move one batch from a Redisson RDelayedQueue into this delayq queue, in
-- one atomic step (the Redisson keys share this queue's slot, or the server is not a
-- cluster): each member leaves Redisson and becomes a delayq task together, or neither.
-- KEYS:  the queue key set (see _lib.lua), then
--        KEYS[14] redisson_delay_queue_timeout:{NAME} (ZSET member -> due ms)
--        KEYS[15] redisson_delay_queue:{NAME} (LIST of members)   KEYS[16] NAME (ready LIST)
-- ARGV[1] 'p': pending members (ZSET and LIST); 'r': the head of the ready list, in order
-- ARGV[2..] groups of 4 fields: the raw member ('p') or ready value ('r'); the delayq id;
--        the envelope; '' or the error that makes it a dead letter (undecodable).
-- Reply: one status digit per group: 1 moved pending (a ready value is due now), 2 moved
--        dead, 0 not there any more (a Redisson timer or consumer, or another mover, took
--        it first: left alone), 3 the id is taken in delayq (left in Redisson).
-- The caller decoded the members it read; a member read then changed is simply not there,
-- so a resent call finds nothing left to move and writes nothing twice.
local source = ARGV[1]
local now = now_ms()
local old_head = head_score(K_DELAYED)
local new_min = nil
local K_TIMEOUTS, K_MEMBERS, K_READY = KEYS[14], KEYS[15], KEYS[16]
local reply = {}
local n = (#ARGV - 1) / 4

local function landed(status, due)
  if status == 1 and (not new_min or score(due, 9) < new_min) then new_min = score(due, 9) end
  reply[#reply + 1] = status
end

if source == 'p' then
  for i = 0, n - 1 do
    local base = 2 + i * 4
    local member = ARGV[base]
    local due = redis.call('ZSCORE', K_TIMEOUTS, member)
    if not due then
      reply[#reply + 1] = 0
    else
      due = math.floor(tonumber(due))
      local status = land_task(ARGV[base + 1], due, ARGV[base + 2], ARGV[base + 3], now)
      if status ~= 3 then
        redis.call('ZREM', K_TIMEOUTS, member)
        -- the list is in offer order and batches are read from its head: LREM stops early
        redis.call('LREM', K_MEMBERS, 1, member)
      end
      landed(status, due)
    end
  end
else
  -- Java consumers pop the same head: move the part of it that still matches what the
  -- caller read (equal values are interchangeable, so matching by position is exact).
  local head = redis.call('LRANGE', K_READY, 0, n - 1)
  local moved = 0
  for i = 0, n - 1 do
    local base = 2 + i * 4
    local status = 0
    if moved == i and head[i + 1] == ARGV[base] then
      status = land_task(ARGV[base + 1], now, ARGV[base + 2], ARGV[base + 3], now)
      if status ~= 3 then moved = moved + 1 end
    end
    landed(status, now)
  end
  if moved > 0 then redis.call('LTRIM', K_READY, moved, -1) end
end
announce_if_earlier(new_min, old_head)
return table.concat(reply)
