"""The networks: loading a frozen classifier, naming and resolving its anchors, choosing default depths, and the
tapper that pools what each anchor records (with the type the store keeps it in). Uses the images' preprocessing;
knows no store."""
