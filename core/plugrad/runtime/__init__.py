"""Runtime building blocks shared by device plugins: compiler base with disk cache, renderer base, HCQ queues."""
