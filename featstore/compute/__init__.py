"""What the core computes from networks, images and stored features and hands back as data, persisting nothing:
the build's batch forward, prefix costs, circuit attributions, feature similarity, and the job specifications
(`specs`) they take."""
