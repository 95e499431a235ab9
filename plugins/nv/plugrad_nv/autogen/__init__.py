"""Generated ctypes bindings (cuda, nvrtc, nvjitlink); regenerate with `make autogen`."""
