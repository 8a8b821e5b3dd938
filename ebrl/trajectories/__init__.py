"""Where env steps become learner batches: the sync rollout buffer, the async segment assembler,
and the staleness-bounded queue between the ebrl scheduler's sampler and learner."""
