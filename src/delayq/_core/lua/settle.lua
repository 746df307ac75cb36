-- settle: shorten the receipts of outbox rows whose deletion committed (see _lib.lua's
-- outbox receipts): nothing can claim those rows again, so their receipts need only outlive
-- a call of the relay still on its way to Redis.
-- KEYS:  the queue key set (see _lib.lua), then KEYS[14]: the shard's applied set
-- ARGV[1] ms to keep the receipts from now   ARGV[2..] apply ids
-- Reply: how many receipts were shortened (an id already gone is left out, never added).
local now = now_ms()
local until_ms = fmt(now + tonumber(ARGV[1]))
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = until_ms
  fields[#fields + 1] = ARGV[i]
end
if #fields == 0 then return 0 end
return redis.call('ZADD', KEYS[14], 'XX', 'LT', 'CH', unpack(fields))
