"""The executor: the one part that touches devices.

The model runner (batch -> flat tensors -> forward -> samples, CUDA graphs), the model, the
sampler, the kernels with their PyTorch references, and quantized weights with their matmuls. It
reads the engine's plain data (a scheduled batch of sequences) and knows nothing of its loop.
"""
