"""The transformers side of the engine: presets and loading, checkpoint-folder checks, the support policy (run
exactly or refuse), the attention glue that plugs the paged cache into transformers, MoE expert dispatch, and
the speed-ups installed into a loaded model."""
