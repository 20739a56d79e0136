



gpt2-small

layers