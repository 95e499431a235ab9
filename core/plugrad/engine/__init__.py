"""Engine: running schedules (realize), the JIT, memory planning."""
