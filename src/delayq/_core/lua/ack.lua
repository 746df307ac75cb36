-- ack: finish tasks whose leases the caller still holds.
-- KEYS:  the queue key set (see _lib.lua), then KEYS[14]: this call's receipt, then
--        KEYS[15..24] the feature keys (keys.py FEATURE_ROLES: read by the plain variant)
-- ARGV[1] ms to keep the receipt (this reply, for a resend of the same call)
-- ARGV[2..] pairs: id, lease token
-- Reply: one status per pair: 1 = acked; 0 = lease lost: expired, or the task was delivered
--        again (and maybe finished) by another consumer. A resent call gets the first reply.
local receipt, keep_ms = KEYS[14], tonumber(ARGV[1])
local now = now_ms()
local ids, tokens = id_token_pairs(2)
local reply, done = finish(ids, tokens, now)
if done < #ids then
  -- A lease not held: perhaps by this very call, sent before (its reply lost). A resend
  -- finds nothing left to finish of what the first one finished, and answers as it did.
  local earlier = stored_reply(receipt)
  if earlier then return earlier end
end
count('acked', done)
keep_reply(receipt, reply, keep_ms)
return reply
