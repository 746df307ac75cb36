"""The order-timeout reference service: FastAPI + PostgreSQL + delayq's transactional outbox.

``POST /orders`` places an order and, in the same transaction, its close task;
``POST /orders/{id}/pay`` pays it and cancels that task in the same transaction; the close
handler closes an order only while it is still pending. See README.md.
"""
