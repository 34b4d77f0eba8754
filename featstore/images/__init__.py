"""The images: image sets on disk, the views (clean and corrupted) of an image, the model's preprocessing, and
the loaders that decode batches for a forward. Knows no network and no store."""
