-- redisson_offer: offer one value to a Redisson RDelayedQueue exactly as Redisson's own
-- offer script does (RedissonDelayedQueue.offerAsync), so Java consumers read it.
-- (standalone: Redisson's keys, not a delayq queue's)
-- KEYS[1] destination list NAME (unused, names the slot as Redisson's call does)
-- KEYS[2] redisson_delay_queue_timeout:{NAME}   KEYS[3] redisson_delay_queue:{NAME}
-- KEYS[4] redisson_delay_queue_channel:{NAME}
-- ARGV[1] due epoch ms (the offering client's clock, as in Redisson)   ARGV[2] packed member
-- Reply: 1 = offered; 0 = this very member is there already (the same call resent after a
-- lost reply: Redisson sends offers without retry because its script would push it twice).
local member = ARGV[2]
if redis.call('ZSCORE', KEYS[2], member) then return 0 end
redis.call('ZADD', KEYS[2], ARGV[1], member)
redis.call('RPUSH', KEYS[3], member)
-- a new head is announced to every client's transfer timer, as Redisson does
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if head[1] == member then redis.call('PUBLISH', KEYS[4], ARGV[1]) end
return 1
