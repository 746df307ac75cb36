-- redisson_claim: take one batch out of a Redisson RDelayedQueue into a claim, the first of
-- the three steps of a move into a delayq queue in another cluster slot (claim here, land
-- there under a receipt, release here): a claimed member is no longer Redisson's to move,
-- and a claim outlives a crash, so the next run lands it again (the receipt makes that once).
-- (standalone: Redisson's keys and the claims hash, all in Redisson's slot)
-- KEYS[1] redisson_delay_queue_timeout:{NAME}   KEYS[2] redisson_delay_queue:{NAME}
-- KEYS[3] NAME (ready LIST)   KEYS[4] redisson_delay_queue_delayq_claims:{NAME} (HASH)
-- ARGV[1] 'p' (pending members) or 'r' (the head of the ready list)   ARGV[2] batch nonce
-- ARGV[3..] the members ('p') or ready values ('r') the caller read
-- Reply: the claim, as stored under the nonce: one entry per member taken, each
--        struct '>dI4c0' (due ms, or -1 for a ready value; length; bytes). '' = none taken.
local K_TIMEOUTS, K_MEMBERS, K_READY, K_CLAIMS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local source, nonce = ARGV[1], ARGV[2]
local parts = {}
if source == 'p' then
  for i = 3, #ARGV do
    local member = ARGV[i]
    local due = redis.call('ZSCORE', K_TIMEOUTS, member)
    if due then
      redis.call('ZREM', K_TIMEOUTS, member)
      redis.call('LREM', K_MEMBERS, 1, member)
      parts[#parts + 1] = struct.pack('>dI4c0', math.floor(tonumber(due)), #member, member)
    end
  end
else
  local head = redis.call('LRANGE', K_READY, 0, #ARGV - 3)
  for i = 3, #ARGV do
    if head[i - 2] ~= ARGV[i] then break end
    parts[#parts + 1] = struct.pack('>dI4c0', -1, #ARGV[i], ARGV[i])
  end
  if #parts > 0 then redis.call('LTRIM', K_READY, #parts, -1) end
end
local claim = table.concat(parts)
if claim ~= '' then redis.call('HSET', K_CLAIMS, nonce, claim) end
return claim
