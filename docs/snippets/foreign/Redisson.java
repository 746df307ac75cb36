// Redisson (Java), shown for comparison: NOT run by delayq's tests.
RedissonClient redisson = Redisson.create();
RBlockingQueue<String> target = redisson.getBlockingQueue("orders");
RDelayedQueue<String> delayed = redisson.getDelayedQueue(target);

delayed.offer("order-42", 30, TimeUnit.MINUTES);
delayed.offer("order-43", 1, TimeUnit.SECONDS);

String order = target.take();     // removed: a crash from here on loses it
closeOrder(order);                // no ack, no retry, no dead letters

String next = target.poll(5, TimeUnit.SECONDS);   // null after 5 s
delayed.remove("order-42");       // by value: scans the delayed queue
