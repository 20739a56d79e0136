


gpt2-medium

layers