"""Integrations of delayq with frameworks: :mod:`delayq.contrib.django`."""
