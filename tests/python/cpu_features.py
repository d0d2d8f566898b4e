"""What this CPU can run, for tests whose expectations depend on it (/proc/cpuinfo's flags).

AVX512: AVX-512 F, which Kiln's 16-channel blocked layouts and bf16 kernels need (without it
the layout pass blocks by 8 and bf16 nodes run fp32). VNNI: int8 dot products of any width
(AVX-512 VNNI, AVX-VNNI or AMX-INT8), which the int8 kernels need (without them int8 nodes run
fp32), as src/kernels/families.c decides.
"""


def _flags():
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


FLAGS = _flags()
AVX512 = " avx512f" in FLAGS
VNNI = any(f in FLAGS for f in (" avx512_vnni", " avx_vnni", " amx_int8"))
