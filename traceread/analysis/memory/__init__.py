"""Where the memory goes: the allocator's ``[memory]`` events of each rank (peak, timeline, headroom,
fragmentation, growth step to step), memory snapshots (largest live allocations at the peak by the
Python frame that made them), and the guide's estimate of the training state beside what was measured.

Map side: :mod:`.rank` (one rank's tables -> a small dict in its summary), :mod:`.snapshot` (one
snapshot file). Reduce side: :mod:`.job` (ranks compared, the model beside the measurement).
:mod:`.phases` finds forward/backward/optimizer in a step, :mod:`.estimate` is the memory model.
See ``docs/memory.md`` for every definition.
"""
