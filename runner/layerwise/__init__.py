"""mode=layerwise: compare every tensor of a target with a reference, and the error each node introduces."""
