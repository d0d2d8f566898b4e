¼
"serve*2.99.0K
.
xPlaceholder*
dtype0*
shape:

yIdentityx*
T0*\
serving_defaultI

x
x:0
y
ghost_output:0tensorflow/serving/predict