"""What tasks are built with, beside the tasks themselves: the Hugging Face hub's models and data
for full scale (hub), the tiny models, tokenizers and data of the tiny scale (tiny_models), the
warm interpreter that runs the anchors at asset build (warm_python), and the digest of a task's
code that keys its assets (sources). Below mlrb.tasks, which uses it; imports nothing of mlrb's,
so that the task's own environment can run warm_python and a task's assets.py tiny_models."""
