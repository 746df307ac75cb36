-- redisson_release: drop a claim once its batch has landed (the last step of a move across
-- slots, see redisson_claim.lua).
-- (standalone: the claims hash in Redisson's slot)
-- KEYS[1] redisson_delay_queue_delayq_claims:{NAME}   ARGV[1] batch nonce
-- Reply: 1 = dropped, 0 = no such claim (already released: a resent call)
return redis.call('HDEL', KEYS[1], ARGV[1])
