"""One site's training (the trainer) and the in-process engine that drives a federation."""
