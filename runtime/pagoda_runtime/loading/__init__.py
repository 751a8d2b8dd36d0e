"""Getting weights into the model: checkpoints (Hugging Face folders, GGUF files, the bundled
model), random weights of a catalogue shape, start-up progress, and the model cache's download."""
