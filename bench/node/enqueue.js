// Enqueue delayed jobs into a BullMQ queue for the delayq peer benchmark (bench/peers/bullmq_node.py).
//
//   node bench/node/enqueue.js URL QUEUE BULK [CHUNK] < jobs.json
//
// jobs.json is a JSON array of payloads {"i": ..., "due": <epoch seconds>, "pad": ...}. Each job
// is added with delay = due - now (ms) at the time of its call: one `queue.add` per job, or with
// BULK=1 `queue.addBulk` per CHUNK jobs (0 or absent = all of them in one call). The script prints
// one JSON line {"n": ..., "seconds": ...}: the time spent in the add calls alone (connecting and
// reading the input excluded).
'use strict';

const { Queue } = require('bullmq');
const IORedis = require('ioredis');

function readStdin() {
  return new Promise((resolve, reject) => {
    const chunks = [];
    process.stdin.on('data', (c) => chunks.push(c));
    process.stdin.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    process.stdin.on('error', reject);
  });
}

function delayOf(data) {
  return Math.max(0, Math.round(data.due * 1000 - Date.now()));
}

async function main() {
  const [url, queueName, bulkArg, chunkArg] = process.argv.slice(2);
  if (!url || !queueName) {
    console.error('usage: node enqueue.js URL QUEUE BULK [CHUNK] < jobs.json');
    process.exit(2);
  }
  const bulk = bulkArg === '1';
  const jobs = JSON.parse(await readStdin());
  const chunk = Number(chunkArg || 0) || jobs.length || 1;

  const connection = new IORedis(url, { maxRetriesPerRequest: null });
  const queue = new Queue(queueName, { connection });
  await queue.waitUntilReady();

  const t0 = process.hrtime.bigint();
  if (bulk) {
    for (let k = 0; k < jobs.length; k += chunk) {
      const part = jobs.slice(k, k + chunk);
      await queue.addBulk(part.map((data) => ({ name: 'bench', data, opts: { delay: delayOf(data) } })));
    }
  } else {
    for (const data of jobs) {
      await queue.add('bench', data, { delay: delayOf(data) });
    }
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;

  await queue.close();
  await connection.quit();
  process.stdout.write(JSON.stringify({ n: jobs.length, seconds }) + '\n');
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
