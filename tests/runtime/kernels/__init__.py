import os

# The Triton kernels run on the CPU through Triton's interpreter, which must be chosen before
# anything (transformers included) imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")
