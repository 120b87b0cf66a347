"""monsoon testing itself: the seeded-defect catch matrix and the load engine's benchmark."""
