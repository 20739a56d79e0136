



gpt2-small
layersè