"""The networks: backbones, heads, side-information models, and the model factory (no Ray)."""
