"""GPU presets: the peak figures of each accelerator a cluster may name, each with its source.

Plain data only (no torch) so `rlgraph compile` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUPreset:
    """Peak figures of one accelerator (or of the local CPU, for the default cluster)."""

    name: str
    bf16_flops: float  # dense bf16 FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: float
    nvlink_bytes_per_s: float  # per GPU, one direction, achievable broadcast
    network_bytes_per_s: float  # per GPU, across nodes
    source: str
    host_bytes_per_s: float = 50e9  # per GPU, GPU <-> host memory (PCIe): offload and reload
    sms: int = 0  # streaming multiprocessors (0: none, the CPU): a kernel of fewer blocks idles


GB = 1e9
GIB = 2**30

GPU_PRESETS: dict[str, GPUPreset] = {
    "H200": GPUPreset(
        "H200", 989e12, 4.8e12, 141 * GB, 352 * GB, 50 * GB,
        "NVIDIA H200 SXM datasheet (989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB); NVLink: NCCL "
        "broadcast measured 352 GB/s with 128 MB buckets on 2x H200 (docs/measurements.md); "
        "network: 400 Gb/s InfiniBand per GPU; host: PCIe Gen5 x16, ~50 GB/s achieved; 132 "
        "SMs, as H100 SXM (the same GH100 configuration)",
        host_bytes_per_s=50 * GB,
        sms=132,
    ),
    "H100": GPUPreset(
        "H100", 989e12, 3.35e12, 80 * GB, 340 * GB, 50 * GB,
        "NVIDIA H100 SXM datasheet (989 TFLOP/s dense bf16, 3.35 TB/s, 80 GB); NVLink 4 "
        "like H200; network: 400 Gb/s InfiniBand per GPU; host: PCIe Gen5 x16, ~50 GB/s; "
        "132 of GH100's 144 SMs enabled on SXM5 (NVIDIA Hopper architecture whitepaper)",
        host_bytes_per_s=50 * GB,
        sms=132,
    ),
    "A100": GPUPreset(
        "A100", 312e12, 2.039e12, 80 * GB, 230 * GB, 25 * GB,
        "NVIDIA A100 80GB SXM datasheet (312 TFLOP/s dense bf16, 2.04 TB/s); NVLink 3 "
        "600 GB/s bidirectional; network: 200 Gb/s HDR per GPU; host: PCIe Gen4 x16, "
        "~25 GB/s achieved; 108 SMs (A100 whitepaper)",
        host_bytes_per_s=25 * GB,
        sms=108,
    ),
    "B200": GPUPreset(
        "B200", 2.25e15, 8.0e12, 180 * GB, 675 * GB, 50 * GB,
        "NVIDIA HGX B200 datasheet (2.25 PFLOP/s dense bf16, 8 TB/s HBM3e, 180 GB, 148 SMs); "
        "NVLink 5 1.8 TB/s bidirectional: 900 GB/s a direction, ~675 achievable at the 75% "
        "H100's 340 of 450 GB/s reaches; network: 400 Gb/s per GPU (ConnectX-7); host: PCIe "
        "Gen5 x16, ~50 GB/s",
        host_bytes_per_s=50 * GB,
        sms=148,
    ),
    "H800": GPUPreset(
        "H800", 989e12, 3.35e12, 80 * GB, 150 * GB, 50 * GB,
        "NVIDIA H800 SXM5 datasheet: the H100 SXM's GH100 (989 TFLOP/s dense bf16, 3.35 TB/s "
        "HBM3, 80 GB, 132 SMs) with NVLink cut to 400 GB/s bidirectional: 200 GB/s a "
        "direction, ~150 achievable at the 75% H100's 340 of 450 GB/s reaches; network: "
        "400 Gb/s per GPU assumed, as for H100 (AReaL's H800 cluster runs NCCL over "
        "InfiniBand / RoCE with GPUDirect RDMA: its v0.2 blog); host: PCIe Gen5 x16, ~50 GB/s",
        host_bytes_per_s=50 * GB,
        sms=132,
    ),
    "A800": GPUPreset(
        "A800", 312e12, 2.039e12, 80 * GB, 153 * GB, 25 * GB,
        "NVIDIA A800 80GB SXM datasheet: the A100 80GB SXM (312 TFLOP/s dense bf16, 2.04 "
        "TB/s, 108 SMs) with NVLink cut to 400 GB/s bidirectional: 200 GB/s a direction, "
        "~153 achievable at the A100's 230 of 300; network: 200 Gb/s HDR per GPU; host: "
        "PCIe Gen4 x16, ~25 GB/s",
        host_bytes_per_s=25 * GB,
        sms=108,
    ),
    "H20": GPUPreset(
        "H20", 148e12, 4.0e12, 96 * GB, 340 * GB, 50 * GB,
        "NVIDIA H20 datasheet (148 TFLOP/s dense bf16, 4.0 TB/s, 96 GB); NVLink 900 GB/s "
        "bidirectional; network: 400 Gb/s per GPU; host: PCIe Gen5 x16, ~50 GB/s; 78 SMs "
        "(its Geekbench 6 listing)",
        host_bytes_per_s=50 * GB,
        sms=78,
    ),
    "cpu": GPUPreset(
        "cpu", 1.66e11, 1e10, 4 * GB, 2 * GB, 1 * GB,
        "one core of this workplace's CI machine running fp32 torch: AMD EPYC, cpu family "
        "26 (Zen 5, /proc/cpuinfo), 2 full-width AVX-512 FMA pipes x 16 fp32 lanes x 2 FLOP "
        "x 2.6 GHz = 166 GFLOP/s peak (other hosts differ: calibrate with `rlgraph compile "
        "--calibrate RUN/trace.json`); memory copies ~10 GB/s",
        host_bytes_per_s=10 * GB,
    ),
}
