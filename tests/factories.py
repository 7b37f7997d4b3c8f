"""Values several test modules build on."""
from tuner.backends import DeviceInfo

PARAMS = {"mm": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")}
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 232448, "580.1", "13.0", "2.11", "3.6")
