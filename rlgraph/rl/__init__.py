"""The RL maths and data: the policy loss and advantages (`loss`), prompts and tasks
(`data`), reward functions (`rewards`), and the `Batch` passed along the graph's edges."""
