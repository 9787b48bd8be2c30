# Sourced by the bench/stage_*.sh scripts: pip download's target for the GPU machine's Python
# (3.12, x86_64 manylinux), binaries only, no dependency resolution (each list is complete).
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any --no-deps)
