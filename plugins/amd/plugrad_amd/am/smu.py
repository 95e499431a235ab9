"""SMU (MP1 13.0.x): the power-management firmware's mailbox (the kernel's smu_cmn / smu_v13_0_0_ppt).

A message is: clear the response register C2PMSG_90, write the argument to C2PMSG_82 and the message id (generated
PPSMC_MSG_*) to C2PMSG_66, then wait for C2PMSG_90 to become non-zero; PPSMC_Result_OK is success and C2PMSG_82 then
holds the answer. The debug mailbox (C2PMSG_75/53/54) takes DEBUGSMC_MSG_Mode1Reset, which resets the whole GPU.
Bring-up tells the SMU where its driver table is (SetDriverDramAddrHigh/Low) and enables all its features.
"""
from __future__ import annotations

from typing import Any

from plugrad_amd.autogen import smu_v13_0_0_ppsmc as S

DRIVER_TABLE_SIZE = 1 << 14
MODE1_RESET_SETTLE_S = 0.5  # the kernel waits 500 ms after a mode-1 reset before touching the GPU again
MSG_NAMES = {v: n for n, v in vars(S).items() if n.startswith("PPSMC_MSG_")}
RESULT_NAMES = {v: n for n, v in vars(S).items() if n.startswith("PPSMC_Result_")}


class SMUError(RuntimeError):
  """The SMU refused a message or didn't answer."""


class SMU:
  def __init__(self, adev: Any) -> None:
    self.adev, self.mp1 = adev, adev.regs["MP1"]
    self.driver_table = adev.boot_alloc(DRIVER_TABLE_SIZE)

  def reg(self, n: int) -> Any: return getattr(self.mp1, f"MP1_SMN_C2PMSG_{n}")

  def send(self, msg: int, arg: int = 0, timeout_s: float | None = None, debug: bool = False) -> int:
    """Send a message and return the SMU's answer (C2PMSG_82), SMUError unless it answers PPSMC_Result_OK."""
    resp, param, msg_reg = (54, 53, 75) if debug else (90, 82, 66)
    self.reg(resp).write(0)
    self.reg(param).write(arg)
    self.reg(msg_reg).write(msg)
    name = f"debug message {msg}" if debug else MSG_NAMES.get(msg, f"message {msg}")
    self.adev.wait(lambda: self.reg(resp).read() != 0, f"the SMU to answer {name}", timeout_s)
    if (r := self.reg(resp).read()) != S.PPSMC_Result_OK: raise SMUError(f"the SMU answered {name} with {RESULT_NAMES.get(r, r)}")
    return self.reg(param).read()

  def alive(self) -> bool:
    """Whether the SMU firmware runs and answers (a GPU left up by an earlier driver)."""
    try: self.send(S.PPSMC_MSG_GetSmuVersion, timeout_s=0.1)
    except (TimeoutError, SMUError): return False
    return True

  def init_hw(self) -> None:
    mc = self.adev.gmc.mc(self.driver_table)
    self.send(S.PPSMC_MSG_SetDriverDramAddrHigh, mc >> 32)
    self.send(S.PPSMC_MSG_SetDriverDramAddrLow, mc % (1 << 32))
    self.send(S.PPSMC_MSG_EnableAllSmuFeatures)

  def mode1_reset(self) -> None:
    """Reset the whole GPU (all blocks back to their power-on state, VRAM kept) through the debug mailbox."""
    self.send(S.DEBUGSMC_MSG_Mode1Reset, debug=True)
    self.adev.settle(MODE1_RESET_SETTLE_S)
