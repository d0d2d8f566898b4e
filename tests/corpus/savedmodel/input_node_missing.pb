º
"serve*2.99.0T
.
xPlaceholder*
dtype0*
shape:
"
yAddV2x
ghost_node*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict