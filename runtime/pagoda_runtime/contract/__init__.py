"""What the runtime and the operator share: torch-free facts and rules, plain data only.

The settings and their flags, the model shape, sizing, the quantization decision, the model
catalogue, model source URIs and the model cache's layout, and the names both processes use. The
operator imports this part of the runtime and no other (a test pins it), and its image installs
only this folder. Nothing here imports another part of the runtime.
"""
