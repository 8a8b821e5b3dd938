"""Shared-memory transport between stage processes: a segment ring and a versioned param slot.

Stage processes (generation, learning) exchange bulk data only through shared
memory and small control messages (slot indices) through queues, so no step
and no segment is ever pickled.
"""
