// BullMQ for Node, shown for comparison: NOT run by delayq's tests.
import { Queue, Worker } from "bullmq";

const connection = { host: "127.0.0.1", port: 6379 };
const queue = new Queue("mails", { connection });

await queue.add(
  "welcome",
  { to: "ada@example.com" },
  {
    delay: 60_000,
    jobId: "w-ada",
    attempts: 5,
    backoff: { type: "exponential", delay: 1000 },
  },
);
const job = await queue.getJob("w-ada");
await job.changeDelay(120_000);

new Worker("mails", async (job) => send(job.data.to), {
  connection,
  concurrency: 16,
});
