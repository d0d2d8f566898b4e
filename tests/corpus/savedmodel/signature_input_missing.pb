µ
"serve*2.99.0K
.
xPlaceholder*
dtype0*
shape:

yIdentityx*
T0*U
serving_defaultB

x
ghost_input:0
y
y:0tensorflow/serving/predict