



gpt2-large

layers