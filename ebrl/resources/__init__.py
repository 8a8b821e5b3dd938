"""The resource manager: pools CPU cores and GPU SMs, sizes every stage from profiles.

inventory  what this machine offers (cores in the affinity mask, memory, JAX
           devices, GPUs and MPS through pynvml)
profiler   measures stage costs against threads / batch size (profile.json)
planner    picks quotas and batch sizes that maximise the bottleneck stage's rate
enforce    applies a plan: thread affinity, EnvPool threads, XLA threads
mps        the MPS control daemon and per-stage process environments (GPUs)
controller runtime feedback: re-plans when measured stage costs drift
"""
