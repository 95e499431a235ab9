"""AM: the userspace driver of `DEV=PCI+AMD` (docs/amd.md, "The PCI interface").

The GPU is found in sysfs (`am.pci`), its BARs are mapped through sysfs resource files or VFIO, and `am.amdev.AMDev`
brings it up from userspace the way the amdgpu kernel driver does: IP discovery table (`am.discovery`), NBIO/HDP
(`am.soc`), GMC page tables on MMHUB/GFXHUB (`am.gmc`), PSP and the IP firmware (`am.psp`, `am.firmware`), SMU
(`am.smu`), GFX compute queue (`am.gfx`) and SDMA (`am.sdma`). Every register access goes through `am.regs`, which takes
offsets, fields and segment bases from the generated bindings (plugrad_amd.autogen) and the discovery table: this
package holds no register offset. `am.runtime.AMDPCIDevice` puts plugrad_amd.device's HCQ queues on top.
Nothing here is imported until PCI+AMD is opened, but `am.sysfs` (device probing) and `am.regs` (register addresses
and field encoding from the bindings, which the KFD runtime's thread-trace programming uses too).
"""
