"""Values several test modules build on."""
from tuner.backends import DeviceInfo

PARAMS = {"mm": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")}
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 232448, "580.1", "13.0", "2.11", "3.6")
# A 32-config mm space: small enough for interpreter runs of the whole CLI.
SMALL_SPACE = """kernel: mm
params: {BLOCK_M: [16, 32], BLOCK_N: [16, 32], BLOCK_K: [32, 64], GROUP_M: [1, 4],
         num_stages: [2], num_warps: [2, 4]}
strategy: {M: align32, N: align32, K: align32, stride_am: align32, stride_bk: align32,
           dtype: default}
"""
