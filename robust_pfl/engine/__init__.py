"""The engine: the floor every other package stands on.

The simulated federation (:mod:`~robust_pfl.engine.federation`) with its stacked client
data and batched objectives, the tasks and data sets, seeded streams, devices, the
registry and validation style every named thing uses, what each defense publishes to
adaptive attacks (:mod:`~robust_pfl.engine.defense_state`), the round loop, progress,
checkpoint files, and the row statistics attacks and defenses share.  ``attacks`` and
``defenses`` import only from here; nothing here imports them, ``theory_checks`` or
the composition root (the rest of :mod:`robust_pfl`)."""
