-- redisson_land: write one claimed batch (redisson_claim.lua) into this delayq queue, once:
-- the receipt KEYS[14] records that the batch landed, so landing it again after a crash
-- (the claim is still there) writes nothing twice. Its reply is kept for as long as a claim
-- may wait to be landed again (ARGV[1]); the mover deletes it once the claim is released.
-- KEYS:  the queue key set (see _lib.lua), then KEYS[14] the batch's receipt
-- ARGV[1] receipt lifetime ms   ARGV[2..] groups of 4: id; due epoch ms ('' = now);
--         envelope; '' or the error that makes it a dead letter.
-- Reply: one status digit per group (1 pending, 2 dead, 3 id taken: the same task landed
--        under an expired receipt), the stored one if the batch landed before.
local receipt = KEYS[14]
local stored = redis.call('GET', receipt)
if stored then return stored end
local now = now_ms()
local old_head = head_score(K_DELAYED)
local new_min = nil
local reply = {}
for i = 2, #ARGV, 4 do
  local due = ARGV[i + 1] == '' and now or tonumber(ARGV[i + 1])
  local status = land_task(ARGV[i], due, ARGV[i + 2], ARGV[i + 3], now)
  if status == 1 and (not new_min or score(due, 9) < new_min) then new_min = score(due, 9) end
  reply[#reply + 1] = status
end
local text = table.concat(reply)
redis.call('SET', receipt, text == '' and '-' or text, 'PX', ARGV[1])
announce_if_earlier(new_min, old_head)
return text
