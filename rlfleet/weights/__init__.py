"""Weight sync between the trainer and vLLM: one seam, one module per transport.

`[weights] transport` picks how step N's weights reach the replicas:
- filesystem (`filesystem.py`): the trainer publishes `weights/step_N` (HF safetensors) and each
  replica reloads it in place, reading the files with vLLM's own loader.
- cuda_ipc (`cuda_ipc.py`): vLLM and the trainer share one GPU; the trainer copies its parameters
  into one of two GPU buffers and vLLM's workers map that memory and load from it.
- nccl (`nccl.py`): trainer rank 0 broadcasts the parameters to every vLLM worker over a process
  group of their own (gloo when the trainer runs on a CPU).

Each transport is one entry of the registry in config/weights.py: its settings, its config and
placement checks, and where its three parts live. Trainer side: `publisher.make_publisher(...)`
builds the entry's publisher. Controller side: `controller.make_controller(...)` owns what differs
by transport (step N's ticket, a relaunched replica's resync) and `client.load(url, ticket)` hands a
ticket to a replica, whose worker runs `vllm_worker.WeightSync` (the ticket's transport's receiver,
`worker_receive` in its module); every transport's load ends in
`vllm_reload.reload_in_place` and sends what `trainer/hf_export.sent_tensors` picks (under LoRA, merged
weights). `tickets` is what both sides share. Checkpoints and resumes load files; a relaunched
replica starts from files and its transport brings it to the served weights (`InferencePool._resync`).
This module stays import-light: the vLLM server command line and the flow import it.
"""

WORKER_EXTENSION = "rlfleet.weights.vllm_worker.WeightSync"
