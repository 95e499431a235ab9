"""Op-group mixins of Tensor: creation, movement, elementwise math, reductions, nn functional."""
