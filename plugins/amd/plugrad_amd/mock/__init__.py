"""Testing support for plugrad-amd: the mock KFD (`DEV=MOCK+AMD`, mock.kfd), the kernel-executor hook (mock.dispatch) and
the RDNA3 emulator that plugs into it (mock.rdna3). Imported only when the MOCK interface is requested."""
